import java.io.File;
import java.net.MalformedURLException;
import java.net.URL;
import java.net.URLClassLoader;
import java.util.ArrayList;
import java.util.List;

/**
 * The system class loader of {@code scripts/smile_java_tests.py}'s run of a test compiled against shadow classes
 * ({@code -Djava.system.class.loader=ShadowFirstLoader -Dsmile.shadow.path=DIR:...}): it defines every class of
 * the folders in {@code smile.shadow.path} and then of {@code java.class.path} itself, delegating only to the
 * platform loader, so a shadow class (the bridge's {@code Tensor} or {@code KvCachePool} with device stubs) replaces
 * the bridge jar's class of that name for every class on the class path (the launcher puts the jar first) and no
 * class is defined twice. Not part of the product.
 */
public final class ShadowFirstLoader extends URLClassLoader {
    static {
        ClassLoader.registerAsParallelCapable();
    }

    public ShadowFirstLoader(ClassLoader parent) {
        super("shadow-first", urls(), parent.getParent());
    }

    private static URL[] urls() {
        List<URL> out = new ArrayList<>();
        for (String key : new String[]{"smile.shadow.path", "java.class.path"}) {
            for (String entry : System.getProperty(key, "").split(File.pathSeparator)) {
                if (entry.isEmpty()) continue;
                try {
                    out.add(new File(entry).toURI().toURL());
                } catch (MalformedURLException e) {
                    throw new IllegalArgumentException(entry, e);
                }
            }
        }
        return out.toArray(new URL[0]);
    }
}
