import java.io.InputStream;
import java.net.Socket;
import java.nio.charset.StandardCharsets;

// Reads one line from HOST:PORT with a blocking InputStream.read (no
// timeout) and prints what the application observed.
public class BlockingClient {
    public static void main(String[] args) throws Exception {
        try (Socket s = new Socket(args[0], Integer.parseInt(args[1]))) {
            InputStream in = s.getInputStream();
            byte[] buf = new byte[100];
            String result;
            try {
                int n = in.read(buf);
                String got = n < 0 ? "" : new String(buf, 0, n, StandardCharsets.US_ASCII);
                result = got.equals("hello from the gate\n") ? "data" : "short:" + got.trim();
            } catch (Exception e) {
                result = e.getClass().getSimpleName() + "(" + e.getMessage() + ")";
            }
            System.out.println("{\"result\": \"" + result + "\"}");
        }
    }
}
