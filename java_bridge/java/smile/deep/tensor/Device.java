package smile.deep.tensor;

import java.util.Objects;

/**
 * A compute device: a {@link DeviceType} and an index. Source compatible with the parts of Smile's
 * {@code smile.deep.tensor.Device} that code creating a KV pool uses ({@link #CPU()}, {@link #CUDA()},
 * {@link #CUDA(byte)}, {@link #MPS()}, {@link #type()}, {@link #index()}, {@code isCUDA/isCPU/isMPS}) and
 * {@link #emptyCache()}.
 *
 * <p>A value type: it names a device for the Python side ({@link #toString()} is torch's device string, such
 * as {@code "cpu"} or {@code "cuda:0"}) and holds no native handle, so Smile's {@code asTorch()},
 * {@code setDefaultDevice()} and {@code preferredDevice()} are absent. {@link #emptyCache()} acts on the allocator of
 * the Python process that serves this JVM. Two devices with the same type and index are equal.
 */
public final class Device {
    private final DeviceType type;
    private final byte index;

    /** The device of {@code type} with Smile's default index: 0 for the CPU, -1 ("the current device") otherwise. */
    public Device(DeviceType type) {
        this(type, (byte) (type == DeviceType.CPU ? 0 : -1));
    }

    /**
     * The device of {@code type} with {@code index} (a negative index means the current device of that type).
     *
     * @throws IllegalArgumentException for a null type, or a CPU index other than 0 or -1.
     */
    public Device(DeviceType type, byte index) {
        if (type == null) throw new IllegalArgumentException("device type must not be null");
        if (type == DeviceType.CPU && index > 0) {
            throw new IllegalArgumentException("the CPU device index must be 0, got " + index);
        }
        this.type = type;
        this.index = type == DeviceType.CPU ? 0 : index;
    }

    /** The CPU. */
    public static Device CPU() {
        return new Device(DeviceType.CPU);
    }

    /** CUDA device 0. */
    public static Device CUDA() {
        return CUDA((byte) 0);
    }

    /** CUDA device {@code index}. */
    public static Device CUDA(byte index) {
        return new Device(DeviceType.CUDA, index);
    }

    /** The Metal GPU of macOS. */
    public static Device MPS() {
        return new Device(DeviceType.MPS);
    }

    /** The device type. */
    public DeviceType type() {
        return type;
    }

    /** The device index (0 for the CPU; negative means the current device of the type). */
    public byte index() {
        return index;
    }

    public boolean isCUDA() {
        return type == DeviceType.CUDA;
    }

    public boolean isCPU() {
        return type == DeviceType.CPU;
    }

    public boolean isMPS() {
        return type == DeviceType.MPS;
    }

    /**
     * Releases the unoccupied memory that the device's caching allocator holds, as Smile does: on CUDA the launcher's
     * Python process runs {@code torch.cuda.empty_cache()}, on MPS {@code torch.mps.empty_cache()} (when torch has
     * MPS). On the CPU it does nothing. It also does nothing when no Python process serves this JVM (not started by
     * {@code python -m java_bridge}): then no torch allocator holds memory in this process.
     */
    public void emptyCache() {
        if (type == DeviceType.CPU) return;
        DeviceRuntime.Backend backend = DeviceRuntime.backend();
        if (backend != null) backend.emptyCache(toString());
    }

    /** torch's device string: {@code "cpu"}, {@code "cuda:0"}, or {@code "cuda"} for the current CUDA device. */
    @Override
    public String toString() {
        return type == DeviceType.CPU || index < 0 ? type.torchName() : type.torchName() + ":" + index;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Device d && d.type == type && d.index == index;
    }

    @Override
    public int hashCode() {
        return Objects.hash(type, index);
    }
}
