package smile.deep.tensor;

import java.util.Optional;

/**
 * The element type of a tensor, source compatible with Smile's {@code smile.deep.tensor.ScalarType}: the same
 * constants, and {@link #code()} returns Smile's code of each (the numbering of c10's {@code ScalarType}, from
 * {@code UInt8} = 0 to {@code UInt64} = 29), with {@link #of(int)} as the lookup by code. A value type only:
 * {@link #torchName()} is the name the Python side resolves (Smile's {@code asTorch()} is absent).
 *
 * <p>Smile's older names {@code Float16}, {@code Float32} and {@code Float64} are kept as aliases of {@link #Half},
 * {@link #Float} and {@link #Double} (the same constants, so they are equal but cannot label {@code switch} cases).
 * A pool accepts only the floating types the Python pool stores (float32, float16, bfloat16, float64,
 * float8_e4m3fn, float8_e5m2); any other is refused with {@link IllegalArgumentException} when the pool is created.
 * The host-array {@link Tensor} holds {@link #Bool}, {@link #Int8}, {@link #Int16}, {@link #Int32},
 * {@link #Int64}, {@link #Float} and {@link #Double}.
 */
public enum ScalarType {
    /** 8-bit unsigned integer (torch's {@code uint8}). */
    UInt8(0, "uint8"),
    /** 8-bit signed integer. */
    Int8(1, "int8"),
    /** 16-bit signed integer. */
    Int16(2, "int16"),
    /** 32-bit signed integer. */
    Int32(3, "int32"),
    /** 64-bit signed integer. */
    Int64(4, "int64"),
    /** IEEE half precision: 5 exponent bits, 11 bits of precision. */
    Half(5, "float16"),
    /** IEEE single precision. */
    Float(6, "float32"),
    /** IEEE double precision. */
    Double(7, "float64"),
    /** A complex number of two half-precision parts. */
    ComplexHalf(8, "complex32"),
    /** A complex number of two single-precision parts. */
    ComplexFloat(9, "complex64"),
    /** A complex number of two double-precision parts. */
    ComplexDouble(10, "complex128"),
    /** Boolean. */
    Bool(11, "bool"),
    /** 8-bit quantized unsigned. */
    QUInt8(12, "quint8"),
    /** 8-bit quantized signed. */
    QInt8(13, "qint8"),
    /** 32-bit quantized signed. */
    QInt32(14, "qint32"),
    /** bfloat16: 8 exponent bits, 8 bits of precision. */
    BFloat16(15, "bfloat16"),
    /** Two 4-bit quantized unsigned values per byte. */
    QUInt4x2(16, "quint4x2"),
    /** Four 2-bit quantized unsigned values per byte. */
    QUInt2x4(17, "quint2x4"),
    /** Eight uninterpreted bits per byte. */
    Bits1x8(18, "bits1x8"),
    /** Four uninterpreted 2-bit values per byte. */
    Bits2x4(19, "bits2x4"),
    /** Two uninterpreted 4-bit values per byte. */
    Bits4x2(20, "bits4x2"),
    /** An uninterpreted byte. */
    Bits8(21, "bits8"),
    /** 16 uninterpreted bits. */
    Bits16(22, "bits16"),
    /** FP8 with 5 exponent and 2 mantissa bits. */
    Float8e5m2(23, "float8_e5m2"),
    /** FP8 with 4 exponent and 3 mantissa bits, finite only. */
    Float8e4m3fn(24, "float8_e4m3fn"),
    /** FP8 e5m2, finite, unsigned zero. */
    Float8e5m2fnuz(25, "float8_e5m2fnuz"),
    /** FP8 e4m3, finite, unsigned zero. */
    Float8e4m3fnuz(26, "float8_e4m3fnuz"),
    /** 16-bit unsigned integer. */
    UInt16(27, "uint16"),
    /** 32-bit unsigned integer. */
    UInt32(28, "uint32"),
    /** 64-bit unsigned integer. */
    UInt64(29, "uint64");

    /** Smile's older name of {@link #Half}. */
    public static final ScalarType Float16 = Half;
    /** Smile's older name of {@link #Float}. */
    public static final ScalarType Float32 = Float;
    /** Smile's older name of {@link #Double}. */
    public static final ScalarType Float64 = Double;

    private static final ScalarType[] BY_CODE = new ScalarType[30];

    static {
        for (ScalarType t : values()) BY_CODE[t.code] = t;
    }

    private final int code;
    private final String torchName;

    ScalarType(int code, String torchName) {
        this.code = code;
        this.torchName = torchName;
    }

    /** Smile's code of this type, which is the value of c10's {@code ScalarType} (for example 6 for {@link #Float}). */
    public int code() {
        return code;
    }

    /** The constant whose {@link #code()} is {@code code}, or empty when no constant has it (as in Smile). */
    public static Optional<ScalarType> of(int code) {
        return code >= 0 && code < BY_CODE.length ? Optional.ofNullable(BY_CODE[code]) : Optional.empty();
    }

    /** The dtype's name in torch, without the {@code "torch."} prefix (for example {@code "float32"}). */
    public String torchName() {
        return torchName;
    }

    /**
     * The constant whose {@link #torchName()} is {@code name} (a {@code "torch."} prefix is ignored).
     *
     * @throws IllegalArgumentException for any other name.
     */
    public static ScalarType ofTorchName(String name) {
        String n = name == null ? "" : name.startsWith("torch.") ? name.substring(6) : name;
        for (ScalarType t : values()) {
            if (t.torchName.equals(n)) return t;
        }
        throw new IllegalArgumentException("no ScalarType for the torch dtype '" + name + "'");
    }
}
