package smile.llm.python;

/** A Python error without a closer Java type: carries the Python type name and its formatted traceback. */
public class PythonException extends RuntimeException {
    private final String pythonType;
    private final String pythonTraceback;

    public PythonException(String message, String pythonType, String pythonTraceback) {
        super(pythonType + ": " + message);
        this.pythonType = pythonType;
        this.pythonTraceback = pythonTraceback;
    }

    /** The Python exception's qualified type, for example "builtins.KeyError". */
    public String pythonType() {
        return pythonType;
    }

    /** The Python traceback, formatted as Python prints it. */
    public String pythonTraceback() {
        return pythonTraceback;
    }
}
