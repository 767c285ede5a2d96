package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Optional;
import smile.deep.tensor.Device;
import smile.deep.tensor.DeviceRuntime;
import smile.deep.tensor.DeviceType;
import smile.deep.tensor.ScalarType;
import smile.deep.tensor.Tensor;

/**
 * Smile's values of {@code DeviceType} and {@code ScalarType}, {@code Device.emptyCache()} (the Python side is
 * checked by {@code test_smile_tensor.py}, which counts the torch calls) and the host-array {@code Tensor} subset:
 * factories, shape accessors, the typed array accessors, copy semantics and refused shapes. No pool is made.
 */
public final class TensorScenarios {
    /** Smile's scalar types in the order of their codes (c10's ScalarType numbering): index i has code i. */
    static final String[] BY_CODE = {"UInt8", "Int8", "Int16", "Int32", "Int64", "Half", "Float", "Double",
        "ComplexHalf", "ComplexFloat", "ComplexDouble", "Bool", "QUInt8", "QInt8", "QInt32", "BFloat16", "QUInt4x2",
        "QUInt2x4", "Bits1x8", "Bits2x4", "Bits4x2", "Bits8", "Bits16", "Float8e5m2", "Float8e4m3fn",
        "Float8e5m2fnuz", "Float8e4m3fnuz", "UInt16", "UInt32", "UInt64"};

    /** The accessors of {@link Tensor} by the element type each reads. */
    static final String[] ACCESSORS = {"byteArray", "shortArray", "intArray", "longArray", "floatArray",
        "doubleArray"};

    private TensorScenarios() {}

    @Scenario
    public static void deviceTypeWhenValueThenSmileCodes(List<String> log) {
        eq(0, DeviceType.CPU.value(), "CPU");
        eq(1, DeviceType.CUDA.value(), "CUDA");
        eq(9, DeviceType.MPS.value(), "MPS (Smile's ST_DeviceType code, not c10's 13)");
        eq(3, DeviceType.values().length, "device types");
        eq("mps", DeviceType.MPS.torchName(), "MPS torch name");
        eq(DeviceType.MPS, Device.MPS().type(), "Device.MPS()");
        log.add("DeviceType values " + DeviceType.CPU.value() + "/" + DeviceType.CUDA.value() + "/"
                + DeviceType.MPS.value());
    }

    @Scenario
    public static void scalarTypeWhenCodeThenRoundTrip(List<String> log) {
        eq(BY_CODE.length, ScalarType.values().length, "one constant per Smile code");
        for (int code = 0; code < BY_CODE.length; code++) {
            ScalarType t = ScalarType.valueOf(BY_CODE[code]);
            eq(code, t.code(), BY_CODE[code] + ".code()");
            eq(Optional.of(t), ScalarType.of(code), "ScalarType.of(" + code + ")");
        }
        for (ScalarType t : ScalarType.values()) {
            eq(t, ScalarType.of(t.code()).orElseThrow(), "of(code()) of " + t);
            eq(t, ScalarType.ofTorchName(t.torchName()), "ofTorchName(torchName()) of " + t);
            eq(t, ScalarType.ofTorchName("torch." + t.torchName()), "ofTorchName(torch.*) of " + t);
        }
        eq(Optional.empty(), ScalarType.of(-1), "of(-1)");
        eq(Optional.empty(), ScalarType.of(30), "of(30)");
        eq(Optional.empty(), ScalarType.of(Integer.MAX_VALUE), "of(MAX_VALUE)");
        eq(6, ScalarType.Float32.code(), "Float32 is Float");
        eq(5, ScalarType.Float16.code(), "Float16 is Half");
        eq(7, ScalarType.Float64.code(), "Float64 is Double");
        eq("float32", ScalarType.Float.torchName(), "Float");
        eq("bfloat16", ScalarType.BFloat16.torchName(), "BFloat16");
        eq("complex64", ScalarType.ComplexFloat.torchName(), "ComplexFloat");
        eq("bool", ScalarType.Bool.torchName(), "Bool");
        expect(IllegalArgumentException.class, "no ScalarType", () -> ScalarType.ofTorchName("float4_e2m1fn_x2"));
        expect(IllegalArgumentException.class, "no ScalarType", () -> ScalarType.ofTorchName(null));
        log.add(ScalarType.values().length + " codes round trip");
    }

    @Scenario
    public static void emptyCacheWhenCpuThenNothingReachesTheBackend(List<String> log) {
        List<String> calls = withRecordingBackend(() -> {
            Device.CPU().emptyCache();
            new Device(DeviceType.CPU, (byte) -1).emptyCache();
        });
        eq(List.of(), calls, "CPU emptyCache calls");
        Device.CPU().emptyCache();  // the launcher's factory installed: still nothing, and no exception
        log.add("CPU emptyCache: no-op");
    }

    @Scenario
    public static void emptyCacheWhenOffCpuThenBackendGetsTorchDevice(List<String> log) {
        List<String> calls = withRecordingBackend(() -> {
            Device.CUDA().emptyCache();
            Device.CUDA((byte) 1).emptyCache();
            new Device(DeviceType.CUDA).emptyCache();
            Device.MPS().emptyCache();
        });
        eq(List.of("cuda:0", "cuda:1", "cuda", "mps"), calls, "devices handed to the backend");
        DeviceRuntime.Backend installed = DeviceRuntime.backend();
        try {
            DeviceRuntime.install(null);
            Device.CUDA().emptyCache();  // no Python process: nothing to release, no exception
        } finally {
            DeviceRuntime.install(installed);
        }
        log.add("backend calls " + calls);
    }

    /** Run by test_smile_tensor.py with torch's empty_cache functions counted: 3 CUDA calls, 1 MPS call. */
    @Scenario
    public static void emptyCacheWhenLauncherFactoryThenPythonCalled(List<String> log) {
        check(DeviceRuntime.backend() != null, "registerFactory installed the device backend");
        Device.CPU().emptyCache();
        Device.CUDA().emptyCache();
        Device.CUDA((byte) 1).emptyCache();
        new Device(DeviceType.CUDA).emptyCache();
        Device.MPS().emptyCache();
        log.add("emptyCache on cpu, cuda:0, cuda:1, cuda, mps");
    }

    @Scenario
    public static void tensorWhenOfThenShapeDtypeAndAccessors(List<String> log) {
        Tensor t = Tensor.of(new int[] {1, 2, 3, 4, 5, 6}, 2, 3);
        eq(new long[] {2, 3}, t.shape(), "shape");
        eq(2, t.dim(), "dim");
        eq(2, t.size(0), "size(0)");
        eq(3, t.size(1), "size(1)");
        eq(3, t.size(-1), "size(-1)");
        eq(2, t.size(-2), "size(-2)");
        eq(6, t.length(), "length");
        eq(ScalarType.Int32, t.dtype(), "dtype");
        eq(Optional.of(ScalarType.Int32), t.dtypeOptional(), "dtypeOptional");
        eq(Device.CPU(), t.device(), "device");
        eq(new int[] {1, 2, 3, 4, 5, 6}, t.intArray(), "intArray");
        eq("Tensor(dtype=Int32, shape=[2, 3])", t.toString(), "toString");
        expect(IndexOutOfBoundsException.class, "[-2, 1], but got 2", () -> t.size(2));
        expect(IndexOutOfBoundsException.class, "but got -3", () -> t.size(-3));

        Tensor v = Tensor.of(new long[] {7, 8, 9});
        eq(new long[] {3}, v.shape(), "no shape: a vector");
        eq(ScalarType.Int64, v.dtype(), "long[]");
        eq(new long[] {7, 8, 9}, v.longArray(), "longArray");

        Tensor f = Tensor.of(new float[] {0.5f, -1f, 2f, 3f}, 2, 1, 2);
        eq(ScalarType.Float, f.dtype(), "float[]");
        eq(3, f.dim(), "dim of [2, 1, 2]");
        check(Arrays.equals(new float[] {0.5f, -1f, 2f, 3f}, f.floatArray()), "floatArray");

        Tensor d = Tensor.of(new double[] {1.25, 2.5}, 1, 2);
        eq(ScalarType.Double, d.dtype(), "double[]");
        check(Arrays.equals(new double[] {1.25, 2.5}, d.doubleArray()), "doubleArray");

        Tensor s = Tensor.of(new short[] {-3, 4});
        eq(ScalarType.Int16, s.dtype(), "short[]");
        check(Arrays.equals(new short[] {-3, 4}, s.shortArray()), "shortArray");

        Tensor b = Tensor.of(new byte[] {-1, 2});
        eq(ScalarType.Int8, b.dtype(), "byte[]");
        check(Arrays.equals(new byte[] {-1, 2}, b.byteArray()), "byteArray");

        Tensor z = Tensor.of(new boolean[] {true, false, true});
        eq(ScalarType.Bool, z.dtype(), "boolean[]");
        check(Arrays.equals(new byte[] {1, 0, 1}, z.byteArray()), "byteArray of Bool: 0 and 1, as in Smile");

        Tensor e = Tensor.of(new float[0], 0, 3);
        eq(new long[] {0, 3}, e.shape(), "an empty tensor");
        eq(0, e.floatArray().length, "no elements");
        eq(new long[] {0}, Tensor.of(new int[0]).shape(), "empty data, no shape");

        try (Tensor closed = Tensor.of(new int[] {1})) {
            eq(1, closed.length(), "try-with-resources, as in Smile");
        }
        log.add(t + " " + v + " " + f + " " + d + " " + s + " " + b + " " + z + " " + e);
    }

    @Scenario
    public static void tensorWhenOtherDtypeAccessorThenIllegalState(List<String> log) {
        Tensor[] tensors = {Tensor.of(new byte[] {1}), Tensor.of(new short[] {1}), Tensor.of(new int[] {1}),
            Tensor.of(new long[] {1}), Tensor.of(new float[] {1}), Tensor.of(new double[] {1}),
            Tensor.of(new boolean[] {true})};
        int refused = 0;
        for (int i = 0; i < tensors.length; i++) {
            Tensor t = tensors[i];
            for (int a = 0; a < ACCESSORS.length; a++) {
                String accessor = ACCESSORS[a];
                boolean reads = a == i || (t.dtype() == ScalarType.Bool && accessor.equals("byteArray"));
                if (reads) {
                    eq(1, java.lang.reflect.Array.getLength(call(t, accessor)), t + "." + accessor);
                } else {
                    IllegalStateException x = expect(IllegalStateException.class, accessor + "() reads a",
                            () -> call(t, accessor));
                    check(x.getMessage().contains("this tensor is " + t.dtype()), x.getMessage());
                    refused++;
                }
            }
        }
        eq(7 * 6 - 7, refused, "every other accessor refuses (no conversion, as in Smile)");
        log.add(refused + " accessor calls refused");
    }

    @Scenario
    public static void tensorWhenSourceOrResultChangedThenUnchanged(List<String> log) {
        int[] data = {1, 2, 3, 4};
        long[] shape = {2, 2};
        Tensor t = Tensor.of(data, shape);
        data[0] = 99;
        shape[0] = 4;
        shape[1] = 1;
        eq(new int[] {1, 2, 3, 4}, t.intArray(), "a copy of the data");
        eq(new long[] {2, 2}, t.shape(), "a copy of the shape");
        t.intArray()[1] = 99;
        t.shape()[1] = 7;
        eq(new int[] {1, 2, 3, 4}, t.intArray(), "intArray returns a new array");
        eq(new long[] {2, 2}, t.shape(), "shape returns a new array");
        check(t.intArray() != t.intArray(), "a new array on every call");

        float[] fd = {1f, 2f};
        Tensor f = Tensor.of(fd);
        fd[0] = 5f;
        f.floatArray()[0] = 6f;
        check(Arrays.equals(new float[] {1f, 2f}, f.floatArray()), "float data copied both ways");
        long[] ld = {3L};
        Tensor l = Tensor.of(ld);
        ld[0] = 4L;
        l.longArray()[0] = 5L;
        eq(new long[] {3L}, l.longArray(), "long data copied both ways");
        boolean[] bd = {false};
        Tensor z = Tensor.of(bd);
        bd[0] = true;
        eq(0, z.byteArray()[0], "bool data copied");
        check(!Tensor.of(new int[] {1}).equals(Tensor.of(new int[] {1})), "identity equality, as in Smile");
        log.add("copies: data, shape, accessors");
    }

    @Scenario
    public static void tensorWhenBadShapeThenIllegalArgumentNamingIt(List<String> log) {
        List<String> messages = new ArrayList<>();
        messages.add(expect(IllegalArgumentException.class, "shape [2, 3] holds 6 elements, but the data has 5",
                () -> Tensor.of(new int[5], 2, 3)).getMessage());
        messages.add(expect(IllegalArgumentException.class, "shape [2, -3]: dimension 1 is negative (-3)",
                () -> Tensor.of(new float[6], 2, -3)).getMessage());
        messages.add(expect(IllegalArgumentException.class, "holds 0 elements, but the data has 1",
                () -> Tensor.of(new long[1], 0, 4)).getMessage());
        messages.add(expect(IllegalArgumentException.class, "holds more than " + Long.MAX_VALUE + " elements",
                () -> Tensor.of(new double[1], 1L << 40, 1L << 40)).getMessage());
        messages.add(expect(IllegalArgumentException.class, "holds 4 elements, but the data has 2",
                () -> Tensor.of(new boolean[2], 4)).getMessage());
        messages.add(expect(IllegalArgumentException.class, "data must not be null",
                () -> Tensor.of((int[]) null, 1)).getMessage());
        messages.add(expect(IllegalArgumentException.class, "shape must not be null",
                () -> Tensor.of(new int[1], (long[]) null)).getMessage());
        messages.add(expect(IllegalArgumentException.class, "data must not be null",
                () -> Tensor.of((float[]) null)).getMessage());
        log.addAll(messages);
    }

    /** Runs {@code body} with a Java backend that records the device strings, then restores the installed one. */
    static List<String> withRecordingBackend(Runnable body) {
        List<String> calls = new ArrayList<>();
        DeviceRuntime.Backend installed = DeviceRuntime.backend();
        DeviceRuntime.install(calls::add);
        try {
            body.run();
        } finally {
            DeviceRuntime.install(installed);
        }
        return calls;
    }

    /** {@code t.accessor()} by reflection; the accessor's own exception comes back unchanged. */
    static Object call(Tensor t, String accessor) {
        try {
            return Tensor.class.getMethod(accessor).invoke(t);
        } catch (java.lang.reflect.InvocationTargetException e) {
            if (e.getCause() instanceof RuntimeException r) throw r;
            throw new AssertionError(accessor, e.getCause());
        } catch (ReflectiveOperationException e) {
            throw new AssertionError("no accessor " + accessor, e);
        }
    }
}
