import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

/**
 * Sends each request its arguments name through the JDK's own HttpClient at its defaults (HTTP/2 preferred:
 * every plain-http request offers an h2c upgrade), as LangChain4j's and Spring AI's default clients do, and prints
 * one line per request: the protocol version of the answer, its status, then its body with newlines escaped.
 *
 * <pre>java DefaultClient BASE_URL (METHOD PATH BODY-OR-"-")...</pre>
 */
public final class DefaultClient {
    public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newHttpClient();
        for (int i = 1; i + 2 < args.length; i += 3) {
            HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(args[0] + args[i + 1]))
                    .timeout(Duration.ofSeconds(60));
            if (args[i].equals("POST")) {
                request.header("Content-Type", "application/json")
                        .POST(HttpRequest.BodyPublishers.ofString(args[i + 2], StandardCharsets.UTF_8));
            } else {
                request.GET();
            }
            HttpResponse<String> response = client.send(request.build(),
                    HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
            System.out.println(response.version() + " " + response.statusCode() + " "
                    + response.body().replace("\n", "\\n"));
        }
    }
}
