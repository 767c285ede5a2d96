package smile.llm.cache;

import java.util.function.Consumer;
import smile.deep.tensor.Tensor;
import smile.llm.python.Bridge;

/**
 * Smile's radix prefix cache, backed by the Python {@code smile_llm.cache.RadixCache}: a page-granular compressed
 * prefix tree from token sequences to KV slot ids, with lock counts and LRU eviction. Source compatible with
 * Smile's class: slot ids cross as int64 host tensors ({@code smile.deep.tensor.Tensor}), and the {@code long[]}
 * forms of {@code insert} and {@code evict} are the bridge's additions.
 *
 * <p>Two kinds of tree:
 * <ul>
 *   <li>A standalone tree, {@code new RadixCache(pageSize)} (created in Python through the launcher's factory, so
 *       the application must run under {@code python -m java_bridge}). Every verb works; it is a pure index.</li>
 *   <li>A pool's own tree, {@link KvCachePool#radix()}. Queries and {@link #matchPrefix} work (serialised with the
 *       pool's lock; a match may split a node and refreshes LRU times, as in Smile). {@link #insert},
 *       {@link #evict}, {@link #incLockRef}, {@link #decLockRef} and {@link #reset} throw
 *       {@link IllegalStateException} and change nothing: the pool owns the tree's pages, so mutate it through the
 *       pool ({@code bindRequest}/{@code bindWithPrefix} lock, {@code finishRequest} inserts, {@code evict}
 *       evicts).</li>
 * </ul>
 *
 * <p>Differences from Smile (the port's fixes): the tree never frees anything itself, so {@link #evict(int)}
 * returns the evicted slot ids for the caller to free; {@link #decLockRef} on a node that is not locked throws
 * {@link IllegalStateException} instead of logging (a count never goes below zero); a node handle of another tree,
 * of an evicted node or from before a {@link #reset()} is refused with {@link IllegalArgumentException}; null token
 * or index arrays are {@link IllegalArgumentException}; {@code priority} is recorded but eviction is plain LRU.
 */
public final class RadixCache {
    /** The verbs a Python tree implements for this class (the bridge's side; applications use RadixCache). */
    public interface Backend {
        MatchResult matchPrefix(int[] tokenIds, String extraKey);
        InsertResult insert(int[] tokenIds, long[] kvIndices, String extraKey, int priority);
        long[] evict(int numTokens);
        int incLockRef(RadixTreeNode node);
        int decLockRef(RadixTreeNode node);
        boolean isEvicted(RadixTreeNode node);
        void reset();
        int totalSize();
        int evictableSize();
        int protectedSize();
        int pageSize();
        String pretty();
        /** The handle of the tree's root (a new root after {@code reset()}). */
        RadixTreeNode root();
    }

    private final Backend tree;
    /** The root's handle, as Smile's package-private field: a miss returns this very object. */
    RadixTreeNode root;

    /** A standalone tree with page size 1. */
    public RadixCache() {
        this(1);
    }

    /**
     * A standalone tree of {@code pageSize} tokens per page, created in Python.
     *
     * @throws IllegalArgumentException if {@code pageSize < 1}.
     * @throws IllegalStateException if the application does not run under the launcher.
     */
    public RadixCache(int pageSize) {
        if (pageSize < 1) throw new IllegalArgumentException("pageSize must be >= 1, got " + pageSize);
        this.tree = Bridge.newRadixCache(pageSize);
        this.root = tree.root();
    }

    /** A tree over {@code backend}; used by the bridge (a pool's {@code radix()}), not by applications. */
    public RadixCache(Backend backend) {
        if (backend == null) throw new IllegalArgumentException("backend must not be null");
        this.tree = backend;
        this.root = backend.root();
    }

    /** The longest cached prefix of {@code tokenIds}, default namespace; see {@link #matchPrefix(int[], String)}. */
    public MatchResult matchPrefix(int[] tokenIds) {
        return matchPrefix(tokenIds, null);
    }

    /**
     * The longest cached prefix of {@code tokenIds} under {@code extraKey} (null: the default namespace), truncated to
     * whole pages. A match that ends inside a node's edge splits the node; LRU times along the path are refreshed;
     * the cached token counts do not change. A miss returns no indices and the root.
     */
    public MatchResult matchPrefix(int[] tokenIds, String extraKey) {
        MatchResult m = tree.matchPrefix(tokenIds, extraKey);
        return m.lastNode().equals(root) ? new MatchResult(m.indices(), root) : m;
    }

    /** {@link #insert(int[], long[], String, int)} in the default namespace with priority 0. */
    public InsertResult insert(int[] tokenIds, long[] kvIndices) {
        return tree.insert(tokenIds, kvIndices, null, 0);
    }

    /**
     * Insert the page-aligned part of {@code tokenIds} with the slot ids {@code kvIndices} (at least one per aligned
     * token; IllegalArgumentException otherwise). {@link InsertResult#prefixLen()} leading tokens were already
     * cached: their {@code kvIndices} are duplicates the caller frees; the tree keeps the rest.
     */
    public InsertResult insert(int[] tokenIds, long[] kvIndices, String extraKey, int priority) {
        return tree.insert(tokenIds, kvIndices, extraKey, priority);
    }

    /** Smile's form of {@link #insert(int[], long[])}: the slot ids as a one-dimensional int64 tensor. */
    public InsertResult insert(int[] tokenIds, Tensor kvIndices) {
        return insert(tokenIds, slotIds(kvIndices), null, 0);
    }

    /** Smile's form of {@link #insert(int[], long[], String, int)}: the slot ids as an int64 tensor. */
    public InsertResult insert(int[] tokenIds, Tensor kvIndices, String extraKey, int priority) {
        return insert(tokenIds, slotIds(kvIndices), extraKey, priority);
    }

    private static long[] slotIds(Tensor kvIndices) {
        if (kvIndices == null) throw new IllegalArgumentException("kvIndices must not be null");
        return kvIndices.longArray();
    }

    /**
     * Evict least-recently-used unlocked leaves (cascading to parents that become unlocked leaves) until
     * {@code numTokens} tokens are gone or nothing is evictable. Returns the evicted slot ids, whole nodes, so
     * possibly more than {@code numTokens}; the caller frees them.
     */
    public long[] evict(int numTokens) {
        return tree.evict(numTokens);
    }

    /**
     * Smile's callback form: {@link #evict(int)}, then {@code freeCallback} is called <em>once</em> with every evicted
     * slot id as an int64 host tensor (not once per node as in Smile), and only if something was evicted; a null
     * callback drops them. Returns the number of evicted tokens.
     */
    public int evict(int numTokens, Consumer<Tensor> freeCallback) {
        long[] slots = tree.evict(numTokens);
        if (freeCallback != null && slots.length > 0) freeCallback.accept(Tensor.of(slots));
        return slots.length;
    }

    /**
     * Lock {@code node} and its ancestors (root excluded) against eviction. Returns the change of
     * {@link #evictableSize()} (&le; 0); a null node or the root changes nothing.
     */
    public int incLockRef(RadixTreeNode node) {
        return tree.incLockRef(node);
    }

    /**
     * Undo one {@link #incLockRef} of {@code node}. Returns the change of {@link #evictableSize()} (&ge; 0).
     *
     * @throws IllegalStateException if a node on the path is not locked (nothing changes).
     */
    public int decLockRef(RadixTreeNode node) {
        return tree.decLockRef(node);
    }

    /** Drop every node (earlier node handles become stale); the caller owns whatever slots the tree indexed. */
    public void reset() {
        tree.reset();
        root = tree.root();
    }

    /** Tokens held by the tree. */
    public int totalSize() {
        return tree.totalSize();
    }

    /** Tokens held by unlocked nodes (what eviction can reclaim). */
    public int evictableSize() {
        return tree.evictableSize();
    }

    /** Tokens held by locked nodes. */
    public int protectedSize() {
        return tree.protectedSize();
    }

    /** Tokens per page (matches and inserts cover whole pages). */
    public int pageSize() {
        return tree.pageSize();
    }

    /** Prints the tree, one node per line, to standard output. */
    public void prettyPrint() {
        System.out.println(tree.pretty());
    }

    @Override
    public String toString() {
        return "RadixCache(pageSize=" + pageSize() + ", totalSize=" + totalSize() + ")";
    }
}
