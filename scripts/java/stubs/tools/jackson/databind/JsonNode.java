package tools.jackson.databind;

import java.util.Map;
import java.util.Set;

/** Stub of Jackson's JsonNode: the calls Smile's sources make. */
public abstract class JsonNode implements Iterable<JsonNode> {
    public abstract JsonNode get(String field);
    public abstract boolean has(String field);
    public abstract boolean isNull();
    public abstract boolean isObject();
    public abstract boolean isArray();
    public abstract String asString();
    public abstract Set<Map.Entry<String, JsonNode>> properties();
}
