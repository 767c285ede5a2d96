package smile.deep.tensor;

/**
 * The compute device type, source compatible with Smile's {@code smile.deep.tensor.DeviceType} for code that sizes or
 * places a KV pool. A value type only: the bridge's tensors live in Python.
 */
public enum DeviceType {
    /** The host CPU. */
    CPU((byte) 0, "cpu"),
    /** An NVIDIA GPU. */
    CUDA((byte) 1, "cuda"),
    /** The GPU of macOS devices (Metal). */
    MPS((byte) 9, "mps");

    private final byte value;
    private final String torchName;

    DeviceType(byte value, String torchName) {
        this.value = value;
        this.torchName = torchName;
    }

    /**
     * The byte code Smile gives this device type: CPU 0, CUDA 1, MPS 9 (the codes of Smile's native
     * {@code ST_DeviceType}, not c10's {@code DeviceType} numbering, where MPS is 13).
     */
    public byte value() {
        return value;
    }

    /** The name torch gives this device type ("cpu", "cuda", "mps"). */
    public String torchName() {
        return torchName;
    }
}
