package smile.deep.tensor;

import java.util.Arrays;
import java.util.Optional;

/**
 * A host-array subset of Smile's {@code smile.deep.tensor.Tensor}: an immutable, dense, row-major array of one
 * {@link ScalarType} with a shape, for the values that Smile's LLM API hands back as tensors (token ids, slot
 * indices, logits, ...). Smile's {@code Tensor} is a LibTorch tensor; this one holds a private copy of a Java array
 * on the host, so {@link #device()} is always the CPU. Device tensors, views, arithmetic, autograd and the other
 * LibTorch operations of Smile's class are out of scope: the bridge's tensors live in the Python process.
 *
 * <p>The members here have Smile's names and signatures, so Smile code that uses only them compiles against the
 * bridge:
 * <ul>
 *   <li>{@code of(data, shape...)} for {@code boolean[]}, {@code byte[]}, {@code short[]}, {@code int[]},
 *       {@code long[]}, {@code float[]} and {@code double[]}, giving {@link ScalarType#Bool}, {@link ScalarType#Int8},
 *       {@link ScalarType#Int16}, {@link ScalarType#Int32}, {@link ScalarType#Int64}, {@link ScalarType#Float} and
 *       {@link ScalarType#Double} tensors. No shape means a vector of the data's length, as in Smile;</li>
 *   <li>{@link #shape()}, {@link #size(int)}, {@link #dim()}, {@link #length()}, {@link #dtype()},
 *       {@link #dtypeOptional()}, {@link #device()}, {@link #close()} and {@link #toString()};</li>
 *   <li>the array accessors {@link #byteArray()}, {@link #shortArray()}, {@link #intArray()}, {@link #longArray()},
 *       {@link #floatArray()} and {@link #doubleArray()}. As in Smile, each reads one element type and does not
 *       convert: {@code intArray()} of a {@code Float} tensor throws. The one exception is Smile's too:
 *       {@code byteArray()} also reads a {@code Bool} tensor, as 0 and 1.</li>
 * </ul>
 *
 * <p>The tensor copies the data it is given and each accessor returns a new array, so neither the caller's array
 * nor an array read back can change it. Equality is identity, as in Smile (where two tensors are equal only when
 * they share a native handle).
 */
public final class Tensor implements AutoCloseable {
    private final ScalarType dtype;
    private final long[] shape;
    /** A private copy: boolean[], byte[], short[], int[], long[], float[] or double[], by {@link #dtype}. */
    private final Object data;
    private final int length;

    private Tensor(ScalarType dtype, Object data, int length, long[] shape) {
        this.dtype = dtype;
        this.shape = checkShape(shape, length);
        this.data = data;
        this.length = length;
    }

    /**
     * A {@link ScalarType#Bool} tensor of a copy of {@code data}.
     *
     * @param data the elements, in row-major order.
     * @param shape the shape; none means {@code {data.length}}.
     * @throws IllegalArgumentException if {@code data} or {@code shape} is null, a dimension is negative, or the
     *     shape holds another number of elements than {@code data}.
     */
    public static Tensor of(boolean[] data, long... shape) {
        return new Tensor(ScalarType.Bool, notNull(data).clone(), data.length, shape);
    }

    /**
     * An {@link ScalarType#Int8} tensor of a copy of {@code data}.
     *
     * @param data the elements, in row-major order.
     * @param shape the shape; none means {@code {data.length}}.
     * @throws IllegalArgumentException as {@link #of(boolean[], long...)}.
     */
    public static Tensor of(byte[] data, long... shape) {
        return new Tensor(ScalarType.Int8, notNull(data).clone(), data.length, shape);
    }

    /**
     * An {@link ScalarType#Int16} tensor of a copy of {@code data}.
     *
     * @param data the elements, in row-major order.
     * @param shape the shape; none means {@code {data.length}}.
     * @throws IllegalArgumentException as {@link #of(boolean[], long...)}.
     */
    public static Tensor of(short[] data, long... shape) {
        return new Tensor(ScalarType.Int16, notNull(data).clone(), data.length, shape);
    }

    /**
     * An {@link ScalarType#Int32} tensor of a copy of {@code data}.
     *
     * @param data the elements, in row-major order.
     * @param shape the shape; none means {@code {data.length}}.
     * @throws IllegalArgumentException as {@link #of(boolean[], long...)}.
     */
    public static Tensor of(int[] data, long... shape) {
        return new Tensor(ScalarType.Int32, notNull(data).clone(), data.length, shape);
    }

    /**
     * An {@link ScalarType#Int64} tensor of a copy of {@code data}.
     *
     * @param data the elements, in row-major order.
     * @param shape the shape; none means {@code {data.length}}.
     * @throws IllegalArgumentException as {@link #of(boolean[], long...)}.
     */
    public static Tensor of(long[] data, long... shape) {
        return new Tensor(ScalarType.Int64, notNull(data).clone(), data.length, shape);
    }

    /**
     * A {@link ScalarType#Float} tensor of a copy of {@code data}.
     *
     * @param data the elements, in row-major order.
     * @param shape the shape; none means {@code {data.length}}.
     * @throws IllegalArgumentException as {@link #of(boolean[], long...)}.
     */
    public static Tensor of(float[] data, long... shape) {
        return new Tensor(ScalarType.Float, notNull(data).clone(), data.length, shape);
    }

    /**
     * A {@link ScalarType#Double} tensor of a copy of {@code data}.
     *
     * @param data the elements, in row-major order.
     * @param shape the shape; none means {@code {data.length}}.
     * @throws IllegalArgumentException as {@link #of(boolean[], long...)}.
     */
    public static Tensor of(double[] data, long... shape) {
        return new Tensor(ScalarType.Double, notNull(data).clone(), data.length, shape);
    }

    /** The element type. */
    public ScalarType dtype() {
        return dtype;
    }

    /** The element type; never empty here (Smile's tensors can hold a type it has no constant for). */
    public Optional<ScalarType> dtypeOptional() {
        return Optional.of(dtype);
    }

    /** The device that holds the data: always the CPU, since this tensor is a host array. */
    public Device device() {
        return Device.CPU();
    }

    /** The number of dimensions. */
    public int dim() {
        return shape.length;
    }

    /** The shape (a new array on every call). */
    public long[] shape() {
        return shape.clone();
    }

    /**
     * The size of dimension {@code dim}; a negative {@code dim} counts from the last dimension, as in torch.
     *
     * @throws IndexOutOfBoundsException if {@code dim} is outside {@code [-dim(), dim())}.
     */
    public long size(int dim) {
        int n = shape.length;
        if (dim < -n || dim >= n) {
            throw new IndexOutOfBoundsException("Dimension out of range (expected to be in range of [" + -n + ", "
                    + (n - 1) + "], but got " + dim + ")");
        }
        return shape[dim < 0 ? dim + n : dim];
    }

    /** The number of elements. */
    public long length() {
        return length;
    }

    /**
     * The elements of an {@link ScalarType#Int8} tensor, or those of a {@link ScalarType#Bool} tensor as 0 and 1.
     *
     * @throws IllegalStateException for any other element type.
     */
    public byte[] byteArray() {
        if (dtype == ScalarType.Bool) {
            boolean[] b = (boolean[]) data;
            byte[] out = new byte[b.length];
            for (int i = 0; i < b.length; i++) out[i] = (byte) (b[i] ? 1 : 0);
            return out;
        }
        return ((byte[]) read(ScalarType.Int8, "byteArray")).clone();
    }

    /**
     * The elements of an {@link ScalarType#Int16} tensor.
     *
     * @throws IllegalStateException for any other element type.
     */
    public short[] shortArray() {
        return ((short[]) read(ScalarType.Int16, "shortArray")).clone();
    }

    /**
     * The elements of an {@link ScalarType#Int32} tensor.
     *
     * @throws IllegalStateException for any other element type ({@code Int64} included: use {@link #longArray()}).
     */
    public int[] intArray() {
        return ((int[]) read(ScalarType.Int32, "intArray")).clone();
    }

    /**
     * The elements of an {@link ScalarType#Int64} tensor.
     *
     * @throws IllegalStateException for any other element type ({@code Int32} included: use {@link #intArray()}).
     */
    public long[] longArray() {
        return ((long[]) read(ScalarType.Int64, "longArray")).clone();
    }

    /**
     * The elements of a {@link ScalarType#Float} tensor.
     *
     * @throws IllegalStateException for any other element type.
     */
    public float[] floatArray() {
        return ((float[]) read(ScalarType.Float, "floatArray")).clone();
    }

    /**
     * The elements of a {@link ScalarType#Double} tensor.
     *
     * @throws IllegalStateException for any other element type.
     */
    public double[] doubleArray() {
        return ((double[]) read(ScalarType.Double, "doubleArray")).clone();
    }

    /** Does nothing: a host array holds no native memory. Present so that Smile's try-with-resources compiles. */
    @Override
    public void close() {}

    /** {@code Tensor(dtype=Int32, shape=[2, 3])}, the form Smile prints. */
    @Override
    public String toString() {
        return "Tensor(dtype=" + dtype + ", shape=" + Arrays.toString(shape) + ")";
    }

    private Object read(ScalarType wanted, String accessor) {
        if (dtype != wanted) {
            throw new IllegalStateException(accessor + "() reads a " + wanted + " tensor, but this tensor is "
                    + dtype + " (no conversion, as in Smile)");
        }
        return data;
    }

    private static <T> T notNull(T data) {
        if (data == null) throw new IllegalArgumentException("data must not be null");
        return data;
    }

    private static long[] checkShape(long[] shape, int length) {
        if (shape == null) throw new IllegalArgumentException("shape must not be null");
        if (shape.length == 0) return new long[] {length};
        for (int i = 0; i < shape.length; i++) {
            if (shape[i] < 0) {
                throw new IllegalArgumentException("shape " + Arrays.toString(shape) + ": dimension " + i
                        + " is negative (" + shape[i] + ")");
            }
        }
        String elements = "0";
        if (Arrays.stream(shape).noneMatch(d -> d == 0)) {
            try {
                elements = String.valueOf(Arrays.stream(shape).reduce(1, Math::multiplyExact));
            } catch (ArithmeticException e) {
                elements = "more than " + Long.MAX_VALUE;
            }
        }
        if (!elements.equals(String.valueOf(length))) {
            throw new IllegalArgumentException("shape " + Arrays.toString(shape) + " holds " + elements
                    + " elements, but the data has " + length);
        }
        return shape.clone();
    }
}
