package smile.llm.cache;

/**
 * What {@link RadixCache#insert} returns, as Smile's {@code InsertResult}.
 *
 * @param prefixLen the leading tokens that were already cached before the insert: their entries of the inserted
 *                  {@code kvIndices} are duplicates the caller frees (the tree keeps its own slots for them).
 * @param lastNode the node that ends the inserted sequence (the root when nothing page-aligned was inserted).
 */
public record InsertResult(int prefixLen, RadixTreeNode lastNode) {}
