// A Curator LeaderLatch steered over stdin/stdout, for tenure's ZooKeeper interop test
// (integration/tests/zookeeper_curator.rs, driven through integration/src/curator.rs).
//
// Run with Java's single-file source launcher, no build step:
//
//   java -cp <curator and zookeeper jars> LatchProbe.java HOST:PORT LATCH_PATH PARTICIPANT_ID
//
// It connects, starts a LeaderLatch on LATCH_PATH with PARTICIPANT_ID and prints one
// line per event or answer:
//
//   ready <our node path>        once the latch's node exists (printed once)
//   leader                       LeaderLatchListener.isLeader() fired
//   notleader                    LeaderLatchListener.notLeader() fired
//   error <text>                 a command or the start failed
//
// Commands, one per line on stdin:
//
//   status        -> hasLeadership=true|false
//   leader        -> leaderid=<id of getLeader()> (the lowest node's data as text;
//                    empty when there are no participants)
//   participants  -> participants=<n>, then n lines "participant <isLeader> <id>" in
//                    the latch's queue order
//   close         -> latch.close(NOTIFY_LEADER) (a leader prints notleader), then closed
//   quit          -> closes the client and exits 0 (so does the end of stdin)
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.retry.RetryNTimes;

public class LatchProbe {
    private static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    private static String oneLine(Throwable e) {
        String text = e.getClass().getSimpleName() + ": " + e.getMessage();
        return text.replace('\n', ' ').replace('\r', ' ');
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: LatchProbe HOST:PORT LATCH_PATH PARTICIPANT_ID");
            System.exit(2);
        }
        String connect = args[0];
        String path = args[1];
        String id = args[2];

        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(connect)
                .sessionTimeoutMs(10_000)
                .connectionTimeoutMs(5_000)
                .retryPolicy(new RetryNTimes(20, 250))
                .build();
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            say("error cannot connect to " + connect);
            client.close();
            System.exit(1);
        }

        LeaderLatch latch = new LeaderLatch(client, path, id);
        latch.addListener(new LeaderLatchListener() {
            @Override
            public void isLeader() {
                say("leader");
            }

            @Override
            public void notLeader() {
                say("notleader");
            }
        });
        latch.start();

        // start() creates the node in the background: announce readiness once it exists,
        // so that the caller knows where the latch queued.
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        String ourPath;
        while ((ourPath = latch.getOurPath()) == null) {
            if (System.nanoTime() > until) {
                say("error the latch's node was not created within 20 s");
                client.close();
                System.exit(1);
            }
            Thread.sleep(10);
        }
        say("ready " + ourPath);

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String command;
        while ((command = in.readLine()) != null) {
            command = command.trim();
            try {
                switch (command) {
                    case "status":
                        say("hasLeadership=" + latch.hasLeadership());
                        break;
                    case "leader":
                        say("leaderid=" + latch.getLeader().getId());
                        break;
                    case "participants": {
                        Collection<Participant> all = latch.getParticipants();
                        List<String> lines = new ArrayList<>();
                        for (Participant p : all) {
                            lines.add("participant " + p.isLeader() + " " + p.getId());
                        }
                        // One synchronized block, so no event line lands in between.
                        synchronized (LatchProbe.class) {
                            say("participants=" + lines.size());
                            for (String line : lines) {
                                say(line);
                            }
                        }
                        break;
                    }
                    case "close":
                        latch.close(LeaderLatch.CloseMode.NOTIFY_LEADER);
                        say("closed");
                        break;
                    case "quit":
                        client.close();
                        System.exit(0);
                        break;
                    case "":
                        break;
                    default:
                        say("error unknown command " + command);
                }
            } catch (Exception e) {
                say("error " + command + ": " + oneLine(e));
            }
        }
        client.close();
        System.exit(0);
    }
}
