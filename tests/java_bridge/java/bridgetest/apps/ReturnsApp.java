package bridgetest.apps;

import smile.llm.cache.KvCacheLayout;
import smile.llm.cache.KvCachePool;
import smile.llm.python.Bridge;

/** Uses a pool and returns from main: the launcher exits 0. Without the launcher, Bridge throws. */
public class ReturnsApp {
    public static void main(String[] args) {
        KvCachePool pool = Bridge.forTesting(new KvCacheLayout(1, 1, 4, 1, 8));
        int id = pool.bindRequest(new int[] {1, 2, 3}, 8);
        pool.checkInvariants();
        System.out.println("ReturnsApp id=" + id + " bound=" + pool.boundRequestCount() + " args="
                + String.join("|", args));
    }
}
