package smile.deep.tensor;

/**
 * The element type of a tensor, source compatible with Smile's {@code smile.deep.tensor.ScalarType} constants for
 * code that creates a KV pool ({@code ScalarType.Float}, {@code BFloat16}, the FP8 types, ...). A value type only:
 * {@link #torchName()} is the name the Python side resolves (Smile's {@code asTorch()} is absent).
 *
 * <p>Smile's older names {@code Float16}, {@code Float32} and {@code Float64} are kept as aliases of {@link #Half},
 * {@link #Float} and {@link #Double} (the same constants, so they are equal but cannot label {@code switch} cases).
 * A pool accepts only the floating types the Python pool stores (float32, float16, bfloat16, float64,
 * float8_e4m3fn, float8_e5m2); any other is refused with {@link IllegalArgumentException} when the pool is created.
 */
public enum ScalarType {
    /** 8-bit quantized unsigned. */
    QUInt8("quint8"),
    /** 8-bit quantized signed. */
    QInt8("qint8"),
    /** 8-bit signed integer. */
    Int8("int8"),
    /** 16-bit signed integer. */
    Int16("int16"),
    /** 32-bit signed integer. */
    Int32("int32"),
    /** 64-bit signed integer. */
    Int64("int64"),
    /** bfloat16: 8 exponent bits, 8 bits of precision. */
    BFloat16("bfloat16"),
    /** IEEE half precision. */
    Half("float16"),
    /** IEEE single precision. */
    Float("float32"),
    /** IEEE double precision. */
    Double("float64"),
    /** FP8 with 4 exponent and 3 mantissa bits, finite only. */
    Float8e4m3fn("float8_e4m3fn"),
    /** FP8 with 5 exponent and 2 mantissa bits. */
    Float8e5m2("float8_e5m2"),
    /** FP8 e4m3, finite, unsigned zero. */
    Float8e4m3fnuz("float8_e4m3fnuz"),
    /** FP8 e5m2, finite, unsigned zero. */
    Float8e5m2fnuz("float8_e5m2fnuz");

    /** Smile's older name of {@link #Half}. */
    public static final ScalarType Float16 = Half;
    /** Smile's older name of {@link #Float}. */
    public static final ScalarType Float32 = Float;
    /** Smile's older name of {@link #Double}. */
    public static final ScalarType Float64 = Double;

    private final String torchName;

    ScalarType(String torchName) {
        this.torchName = torchName;
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
