package smile.llm.cache;

/**
 * A handle to one node of a {@link RadixCache}: what {@link MatchResult#lastNode()} and
 * {@link InsertResult#lastNode()} return and what {@link RadixCache#incLockRef}/{@link RadixCache#decLockRef} take.
 * Like Smile's {@code RadixTreeNode} it exposes {@code public final long id} (unique in the process) and
 * {@link #isEvicted()}; the node itself (tokens, slots, lock count) lives in the Python tree.
 *
 * <p>A handle is resolved by id in the tree that issued it. A handle of another tree, of a node that was evicted,
 * or of a tree that was {@link RadixCache#reset() reset} since, is refused by the lock verbs with
 * {@link IllegalArgumentException}. Two handles of the same node are equal.
 */
public final class RadixTreeNode {
    /** The node's id, unique among the nodes of every tree in the process. */
    public final long id;
    private final RadixCache.Backend tree;

    /** A handle of node {@code id} of {@code tree}; made by the bridge, not by applications. */
    public RadixTreeNode(long id, RadixCache.Backend tree) {
        if (tree == null) throw new IllegalArgumentException("tree must not be null");
        this.id = id;
        this.tree = tree;
    }

    /** True once the node is no longer in its tree: evicted, or dropped by a reset. */
    public boolean isEvicted() {
        return tree.isEvicted(this);
    }

    /** The tree that issued this handle (the bridge checks handles against it). */
    public RadixCache.Backend tree() {
        return tree;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof RadixTreeNode n && n.id == id; // ids are unique in the process
    }

    @Override
    public int hashCode() {
        return Long.hashCode(id);
    }

    @Override
    public String toString() {
        return "RadixTreeNode{id=" + id + "}";
    }
}
