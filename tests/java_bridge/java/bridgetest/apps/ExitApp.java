package bridgetest.apps;

import smile.llm.cache.KvCacheLayout;
import smile.llm.cache.KvCachePool;
import smile.llm.python.Bridge;

/** Creates a pool (the launcher's cleanup must close it) and calls System.exit(args[0]). */
public class ExitApp {
    public static void main(String[] args) {
        KvCachePool pool = Bridge.forTesting(new KvCacheLayout(1, 1, 4, 1, 8));
        pool.bindRequest(new int[] {1, 2, 3}, 8);
        System.out.println("ExitApp exiting with " + args[0]);
        System.out.flush();
        System.exit(Integer.parseInt(args[0]));
    }
}
