import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/**
 * A chat turn from a smile-llm server ({@code smile-llm serve}) over its OpenAI-compatible API, with the JDK alone:
 * {@code java.net.http.HttpClient}, the server-sent events read line by line ({@code BodyHandlers.ofLines()}), the
 * request's JSON written by hand and the answers read by a small JSON parser. Java 17, no dependencies.
 *
 * <pre>
 * javac --release 17 -encoding UTF-8 -d out java_bridge/examples/http/ChatOverHttp.java
 * java -cp out ChatOverHttp "Name a color."
 * java -cp out ChatOverHttp --max-tokens 64 --temperature 0 --no-stream "Name a color."
 * </pre>
 *
 * The reply goes to standard output exactly as the server sends it (UTF-8), each delta as it arrives; the finish
 * reason, the usage and errors go to standard error. Exit code: 0 done, 1 the server refused or failed (its error
 * object's message is printed) or could not be reached, 2 bad arguments.
 */
public final class ChatOverHttp {
    static final String USAGE = """
            usage: java ChatOverHttp [options] PROMPT...   (several words are joined by spaces;
                   PROMPT "-" reads the prompt from standard input, as UTF-8, as is)
              --url URL          the server's base URL (default http://127.0.0.1:8000)
              --api-key KEY      sent as "Authorization: Bearer KEY" (default: $SMILE_LLM_API_KEY, else none)
              --model NAME       the request's model (default: not sent; the server uses the model it serves)
              --system TEXT      a system message before the prompt
              --max-tokens N     the most tokens to generate (default 256)
              --temperature T    (default: not sent; the server's default is 1)
              --no-stream        ask for one JSON response instead of server-sent events
              --timeout S        seconds to connect and to get the response's headers (default 300)
              --dry-run          print the request body and exit without sending it
            """;

    /** A bad command line (exit code 2), or --help (a null message: the usage on standard output, exit code 0). */
    static final class UsageError extends Exception {
        private static final long serialVersionUID = 1L;

        UsageError(String message) { super(message); }
    }

    record Options(String url, String apiKey, String model, String system, String prompt, int maxTokens,
                   Double temperature, boolean stream, Duration timeout, boolean dryRun) {

        static Options parse(String[] args, String envKey) throws UsageError, IOException {
            String url = "http://127.0.0.1:8000", apiKey = envKey, model = null, system = null;
            int maxTokens = 256;
            Double temperature = null;
            boolean stream = true, dryRun = false;
            long timeout = 300;
            List<String> words = new ArrayList<>();
            for (int i = 0; i < args.length; i++) {
                String a = args[i];
                if (a.equals("--")) {
                    words.addAll(List.of(args).subList(i + 1, args.length));
                    break;
                }
                if (!a.startsWith("--")) {
                    words.add(a);
                    continue;
                }
                switch (a) {
                    case "--no-stream" -> stream = false;
                    case "--dry-run" -> dryRun = true;
                    case "--help" -> throw new UsageError(null);
                    default -> {
                        if (i + 1 >= args.length) throw new UsageError(a + " needs a value");
                        String v = args[++i];
                        switch (a) {
                            case "--url" -> url = v;
                            case "--api-key" -> apiKey = v;
                            case "--model" -> model = v;
                            case "--system" -> system = v;
                            case "--max-tokens" -> maxTokens = (int) whole(a, v, 0, Integer.MAX_VALUE);
                            case "--temperature" -> temperature = temperature(v);
                            case "--timeout" -> timeout = whole(a, v, 1, 86_400);
                            default -> throw new UsageError("unknown option " + a);
                        }
                    }
                }
            }
            if (words.isEmpty()) throw new UsageError("give a prompt");
            String prompt = words.equals(List.of("-"))
                    ? new String(System.in.readAllBytes(), StandardCharsets.UTF_8) : String.join(" ", words);
            url = url.replaceAll("/+$", "");
            if (!url.startsWith("http://") && !url.startsWith("https://")) {
                throw new UsageError("--url must start with http:// or https://, got " + url);
            }
            if (apiKey != null && apiKey.isEmpty()) apiKey = null;
            return new Options(url, apiKey, model, system, prompt, maxTokens, temperature, stream,
                    Duration.ofSeconds(timeout), dryRun);
        }

        private static long whole(String option, String value, long min, long max) throws UsageError {
            try {
                long n = Long.parseLong(value);
                if (n >= min && n <= max) return n;
            } catch (NumberFormatException e) {
                // reported below
            }
            throw new UsageError(option + " must be a whole number in [" + min + ", " + max + "], got " + value);
        }

        private static double temperature(String value) throws UsageError {
            try {
                double t = Double.parseDouble(value);
                if (t >= 0 && Double.isFinite(t)) return t;
            } catch (NumberFormatException e) {
                // reported below
            }
            throw new UsageError("--temperature must be a number >= 0, got " + value);
        }

        /** The chat completions endpoint: the base URL, with or without its {@code /v1}. */
        URI endpoint() {
            return URI.create(url + (url.endsWith("/v1") ? "" : "/v1") + "/chat/completions");
        }
    }

    public static void main(String[] args) {
        // Java 17 writes System.out in the platform's charset (often ASCII in containers); the reply is UTF-8.
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
        PrintStream err = new PrintStream(new FileOutputStream(FileDescriptor.err), true, StandardCharsets.UTF_8);
        int code;
        try {
            code = run(Options.parse(args, System.getenv("SMILE_LLM_API_KEY")), out, err);
        } catch (UsageError e) {
            if (e.getMessage() == null) {
                out.print(USAGE);
                code = 0;
            } else {
                err.println("error: " + e.getMessage());
                err.print(USAGE);
                code = 2;
            }
        } catch (IOException e) {
            err.println("error: cannot read the prompt: " + e);
            code = 2;
        }
        out.flush();
        err.flush();
        System.exit(code);
    }

    static int run(Options o, PrintStream out, PrintStream err) throws UsageError {
        String body = requestBody(o);
        if (o.dryRun()) {
            out.println(body);
            return 0;
        }
        URI endpoint;
        try {
            endpoint = o.endpoint();
        } catch (IllegalArgumentException e) {
            throw new UsageError("--url is not a valid URL: " + e.getMessage());
        }
        // The client's defaults (HTTP/2 preferred): on a plain http:// URL it offers an h2c upgrade with each
        // request, which the server declines, answering over HTTP/1.1.
        HttpClient client = HttpClient.newBuilder().connectTimeout(o.timeout()).build();
        HttpRequest.Builder request = HttpRequest.newBuilder(endpoint).timeout(o.timeout())
                .header("Content-Type", "application/json")
                .header("Accept", o.stream() ? "text/event-stream" : "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(body, StandardCharsets.UTF_8));
        if (o.apiKey() != null) request.header("Authorization", "Bearer " + o.apiKey());
        try {
            return o.stream() ? streamed(client, request.build(), out, err) : whole(client, request.build(), out, err);
        } catch (IOException e) {
            err.println("error: no answer from " + endpoint + ": " + describe(e));
            return 1;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            err.println("error: interrupted");
            return 1;
        } catch (IllegalArgumentException e) {  // a body that is not the JSON it should be
            err.println("error: " + e.getMessage());
            return 1;
        }
    }

    /** The request: {@code messages} (an optional system message, then the prompt as the user's), the sampling
     * fields, and {@code stream} with {@code stream_options.include_usage} so that the last event carries usage. */
    static String requestBody(Options o) {
        StringBuilder b = new StringBuilder("{");
        if (o.model() != null) b.append("\"model\":").append(quote(o.model())).append(',');
        b.append("\"messages\":[");
        if (o.system() != null) b.append("{\"role\":\"system\",\"content\":").append(quote(o.system())).append("},");
        b.append("{\"role\":\"user\",\"content\":").append(quote(o.prompt())).append("}]");
        b.append(",\"max_tokens\":").append(o.maxTokens());
        if (o.temperature() != null) b.append(",\"temperature\":").append(o.temperature());  // finite: valid JSON
        b.append(o.stream() ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : ",\"stream\":false");
        return b.append('}').toString();
    }

    /** A JSON string: quote, backslash and control characters escaped, and every character past ASCII as a
     * {@code \\u} escape of its four hex digits (UTF-16 code units, so a surrogate pair becomes two escapes, which
     * JSON readers join), so the body is plain ASCII. */
    static String quote(String s) {
        StringBuilder b = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                case '\b' -> b.append("\\b");
                case '\f' -> b.append("\\f");
                default -> {
                    if (c < 0x20 || c >= 0x7f) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
                }
            }
        }
        return b.append('"').toString();
    }

    /** Streaming: one server-sent event per chunk ({@code data: {...}} and a blank line), {@code data: [DONE]}
     * last. Each {@code choices[0].delta.content} is printed as it arrives; the finish reason and {@code usage}
     * (the last event, whose {@code choices} is empty) at the end. */
    static int streamed(HttpClient client, HttpRequest request, PrintStream out, PrintStream err)
            throws IOException, InterruptedException {
        HttpResponse<Stream<String>> response = client.send(request, HttpResponse.BodyHandlers.ofLines());
        try (Stream<String> lines = response.body()) {  // closing it early closes the connection
            if (response.statusCode() != 200) {
                return refused(err, response.statusCode(), lines.collect(Collectors.joining("\n")));
            }
            String finishReason = null;
            Object usage = null;
            StringBuilder data = new StringBuilder();
            boolean pending = false;
            Iterator<String> it = lines.iterator();
            while (true) {
                String line = it.hasNext() ? it.next() : null;
                if (line != null && !line.isEmpty()) {  // a field of the event being read
                    if (line.startsWith("data:")) {
                        String value = line.substring(5);
                        if (pending) data.append('\n');
                        data.append(value.startsWith(" ") ? value.substring(1) : value);
                        pending = true;
                    }  // comments (":...") and other fields (event:, id:, retry:) are not used here
                    continue;
                }
                if (!pending) {  // a blank line with no data, or the end
                    if (line == null) break;
                    continue;
                }
                String payload = data.toString();  // a blank line (or the end) completes the event
                data.setLength(0);
                pending = false;
                if (payload.equals("[DONE]")) {
                    out.flush();
                    summary(err, finishReason, usage);
                    return 0;
                }
                Object event = Json.parse(payload);
                String error = errorMessage(event);  // a request that fails mid-stream sends an error object
                if (error != null) {
                    out.flush();
                    err.println();
                    err.println("error: " + error);
                    return 1;
                }
                Object choice = first(get(event, "choices"));
                if (get(get(choice, "delta"), "content") instanceof String text && !text.isEmpty()) {
                    out.print(text);
                    out.flush();
                }
                if (get(choice, "finish_reason") instanceof String reason) finishReason = reason;
                if (get(event, "usage") instanceof Map<?, ?> u) usage = u;
                if (line == null) break;
            }
            out.flush();
            err.println();
            err.println("error: the stream ended before data: [DONE]");
            return 1;
        }
    }

    /** Without streaming: one chat completion object, {@code choices[0].message.content} and {@code usage}. */
    static int whole(HttpClient client, HttpRequest request, PrintStream out, PrintStream err)
            throws IOException, InterruptedException {
        HttpResponse<String> response = client.send(request, HttpResponse.BodyHandlers.ofString());
        if (response.statusCode() != 200) return refused(err, response.statusCode(), response.body());
        Object body = Json.parse(response.body());
        Object choice = first(get(body, "choices"));
        if (get(get(choice, "message"), "content") instanceof String text) out.print(text);
        out.flush();
        summary(err, get(choice, "finish_reason") instanceof String r ? r : null, get(body, "usage"));
        return 0;
    }

    static void summary(PrintStream err, String finishReason, Object usage) {
        err.println();
        err.println("finish_reason: " + finishReason);
        if (usage == null) {
            err.println("usage: not reported");
            return;
        }
        err.println("usage: prompt_tokens=" + get(usage, "prompt_tokens")
                + " completion_tokens=" + get(usage, "completion_tokens")
                + " total_tokens=" + get(usage, "total_tokens")
                + " cached_tokens=" + get(get(usage, "prompt_tokens_details"), "cached_tokens"));
    }

    /** A status other than 200: the OpenAI error object's message ({@code {"error": {"message": ...}}}), or the
     * body as it is when it is not one. Exit code 1. */
    static int refused(PrintStream err, int status, String body) {
        String message;
        try {
            message = errorMessage(Json.parse(body));
        } catch (IllegalArgumentException e) {
            message = null;
        }
        if (message == null) message = body.length() > 500 ? body.substring(0, 500) + "..." : body;
        err.println("error: HTTP " + status + ": " + message);
        return 1;
    }

    static String errorMessage(Object value) {
        Object error = get(value, "error");
        if (error == null) return null;
        return get(error, "message") instanceof String m ? m : String.valueOf(error);
    }

    static Object get(Object object, String key) {
        return object instanceof Map<?, ?> m ? m.get(key) : null;
    }

    static Object first(Object array) {
        return array instanceof List<?> l && !l.isEmpty() ? l.get(0) : null;
    }

    static String describe(Throwable e) {
        String m = e.getMessage();
        return e.getClass().getSimpleName() + (m == null || m.isEmpty() ? "" : ": " + m);
    }

    /** A small JSON reader: objects as {@code Map}, arrays as {@code List}, strings, {@code Long} or {@code Double},
     * {@code Boolean} and {@code null}. Malformed text is an {@code IllegalArgumentException}. */
    static final class Json {
        private final String s;
        private int i;

        private Json(String s) { this.s = s; }

        static Object parse(String text) {
            Json p = new Json(text);
            Object v = p.value();
            p.space();
            if (p.i != p.s.length()) throw p.error("unexpected text after the value");
            return v;
        }

        private Object value() {
            space();
            if (i >= s.length()) throw error("unexpected end");
            return switch (s.charAt(i)) {
                case '{' -> object();
                case '[' -> array();
                case '"' -> string();
                case 't' -> literal("true", Boolean.TRUE);
                case 'f' -> literal("false", Boolean.FALSE);
                case 'n' -> literal("null", null);
                default -> number();
            };
        }

        private Map<String, Object> object() {
            Map<String, Object> map = new LinkedHashMap<>();
            i++;
            space();
            if (peek('}')) return map;
            do {
                space();
                if (i >= s.length() || s.charAt(i) != '"') throw error("expected a key");
                String key = string();
                space();
                expect(':');
                map.put(key, value());
                space();
            } while (peek(','));
            expect('}');
            return map;
        }

        private List<Object> array() {
            List<Object> list = new ArrayList<>();
            i++;
            space();
            if (peek(']')) return list;
            do {
                list.add(value());
                space();
            } while (peek(','));
            expect(']');
            return list;
        }

        private String string() {
            StringBuilder b = new StringBuilder();
            i++;
            while (true) {
                if (i >= s.length()) throw error("unterminated string");
                char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c < 0x20) throw error("control character in a string");
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                if (i >= s.length()) throw error("unterminated string");
                char e = s.charAt(i++);
                switch (e) {
                    case '"', '\\', '/' -> b.append(e);
                    case 'b' -> b.append('\b');
                    case 'f' -> b.append('\f');
                    case 'n' -> b.append('\n');
                    case 'r' -> b.append('\r');
                    case 't' -> b.append('\t');
                    case 'u' -> {  // one UTF-16 unit; the two escapes of a surrogate pair join in the builder
                        if (i + 4 > s.length()) throw error("short \\u escape");
                        try {
                            b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        } catch (NumberFormatException x) {
                            throw error("bad \\u escape");
                        }
                        i += 4;
                    }
                    default -> throw error("bad escape \\" + e);
                }
            }
        }

        private Object number() {
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            String n = s.substring(start, i);
            try {
                if (n.matches("-?(0|[1-9][0-9]*)")) {
                    try {
                        return Long.parseLong(n);
                    } catch (NumberFormatException tooLong) {
                        return Double.parseDouble(n);
                    }
                }
                if (n.matches("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?")) return Double.parseDouble(n);
            } catch (NumberFormatException ignored) {
                // falls through to the error
            }
            i = start;
            throw error("expected a value");
        }

        private Object literal(String word, Object v) {
            if (!s.startsWith(word, i)) throw error("expected a value");
            i += word.length();
            return v;
        }

        private void space() {
            while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) i++;
        }

        private boolean peek(char c) {
            if (i < s.length() && s.charAt(i) == c) {
                i++;
                return true;
            }
            return false;
        }

        private void expect(char c) {
            if (!peek(c)) throw error("expected '" + c + "'");
        }

        private IllegalArgumentException error(String what) {
            return new IllegalArgumentException("invalid JSON at offset " + i + ": " + what);
        }
    }
}
