package smile.llm.attention;

/** Stub (out of the bridge's scope). */
public final class FlashInferArtifacts {
    private FlashInferArtifacts() {}

    public static void resolveAndInstall(String aotDir, String cacheDir, boolean download, String cudaTag) {
        throw new UnsupportedOperationException();
    }
}
