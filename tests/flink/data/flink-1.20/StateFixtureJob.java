// The Flink 2.3 fixture job of /work/shared/flink/flink-java-dev, run on Flink 1.20.5 (only its
// configuration keys added: 1.20 reads the 1.x names) for real _metadata version 4 snapshots.
//
//   java -cp <flink-dist + log4j jars>:classes StateFixtureJob \
//        --backend rocksdb|hashmap --key-type string|long --out DIR \
//        --keys 3000 --max-parallelism 128 --parallelism 2 --retained 3 \
//        --rate-per-subtask 1000 --interval-ms 1500 --plan "3:C,6:N,8:X" [--inline-threshold 1kb]
//
// Plan: comma-separated "afterCheckpointId:ACTION"; ACTION C = trigger canonical savepoint,
// N = trigger native savepoint, X = cancel the job (RETAIN_ON_CANCELLATION keeps the checkpoints).
// Each step waits until a *completed* checkpoint (chk-N/_metadata) with id >= afterCheckpointId exists.
//
// Input (fully deterministic, see gen()): a DataGeneratorSource over [0, p*PER) split by
// NumberSequenceSource into p contiguous splits of PER indexes; index i belongs to split s=i/PER and
// every key is produced by exactly one split (key index k with k % p == s), so the per-key record
// order is the split order and the keyed state at a checkpoint is a pure function of the split
// positions stored in that checkpoint's source reader state.
//
// Keyed state (KeyedProcessFunction, uid "agg"):
//   ValueState<Long>         total      sum of amounts
//   MapState<String, Long>   merchants  count per merchant
//   ListState<Long>          recent     last 5 amounts (add() while < 5 elements, else update())
//   ValueState<Long>         lastSeen   event ts of the last record, StateTtlConfig 1 h processing time
// The function also keeps a plain Java mirror of its state and dumps it at every snapshotState()
// (shadow/<checkpointId>-<subtask>.jsonl) as an independent cross-check of the expected state.

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.*;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.connector.source.util.ratelimit.RateLimiterStrategy;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.connector.datagen.source.GeneratorFunction;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.core.execution.SavepointFormatType;
import org.apache.flink.runtime.state.FunctionInitializationContext;
import org.apache.flink.runtime.state.FunctionSnapshotContext;
import org.apache.flink.streaming.api.checkpoint.CheckpointedFunction;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

import java.io.*;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.TimeUnit;

public class StateFixtureJob {

    /** Indexes per source split: large enough that no split ever finishes during a run. */
    public static final long PER = 1_000_000_000L;
    public static final long BASE_TS = 1_767_225_600_000L; // 2026-01-01T00:00:00Z

    public static final String[] MERCHANTS = {
        "amazon", "uber", "netflix", "café-de-flore", "Müller-Markt", "京东商城",
        "starbucks", "spotify", "🍕-pizza-place", "shell", "ikea", "el-niño-tacos",
    };

    /** splitmix64 finaliser. */
    public static long mix64(long z) {
        z += 0x9E3779B97F4A7C15L;
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }

    /** Long account ids: non-contiguous; half of them above 2^32 so Long.hashCode folds both halves. */
    public static long accountId(int k) {
        if (k % 2 == 0) {
            return 1L + 10L * k + (k * 7L) % 10L;
        }
        return 4_294_967_296L * (1 + (k % 5)) + 13L * k;
    }

    public static String cardId(int k) {
        return String.format("card-%06d", k);
    }

    public static class Txn implements Serializable {
        public String card;
        public long account;
        public long amount;
        public String merchant;
        public long ts;

        public Txn() {}
    }

    public static class Gen implements GeneratorFunction<Long, Txn> {
        final int p;
        final int numKeys;

        Gen(int p, int numKeys) {
            this.p = p;
            this.numKeys = numKeys;
        }

        @Override
        public Txn map(Long idx) {
            long i = idx;
            int s = (int) (i / PER);
            long j = i % PER;
            int ns = (numKeys - s + p - 1) / p;                 // keys k < numKeys with k % p == s
            int kpos = (int) ((mix64(i) >>> 1) % ns);
            int k = s + p * kpos;
            Txn t = new Txn();
            t.card = cardId(k);
            t.account = accountId(k);
            t.amount = 1 + (mix64(i ^ 0x5DEECE66DL) >>> 1) % 20000;
            t.merchant = MERCHANTS[(int) ((mix64(i * 31 + 7) >>> 1) % MERCHANTS.length)];
            t.ts = BASE_TS + j * 100 + s;
            return t;
        }
    }

    /** Keyed aggregation; K = String (card) or Long (account). */
    public static class Agg<K> extends KeyedProcessFunction<K, Txn, String> implements CheckpointedFunction {
        final String shadowDir;
        transient ValueState<Long> total;
        transient MapState<String, Long> merchants;
        transient ListState<Long> recent;
        transient ValueState<Long> lastSeen;
        transient Map<Object, Mirror> mirror;

        static class Mirror {
            long total;
            TreeMap<String, Long> merchants = new TreeMap<>();
            ArrayList<Long> recent = new ArrayList<>();
            long lastSeen;
        }

        Agg(String shadowDir) {
            this.shadowDir = shadowDir;
        }

        @Override
        public void initializeState(FunctionInitializationContext ctx) {
            mirror = new HashMap<>();
        }

        @Override
        public void open(OpenContext openContext) {
            total = getRuntimeContext().getState(new ValueStateDescriptor<>("total", Types.LONG));
            merchants = getRuntimeContext().getMapState(new MapStateDescriptor<>("merchants", Types.STRING, Types.LONG));
            recent = getRuntimeContext().getListState(new ListStateDescriptor<>("recent", Types.LONG));
            ValueStateDescriptor<Long> ls = new ValueStateDescriptor<>("lastSeen", Types.LONG);
            ls.enableTimeToLive(StateTtlConfig.newBuilder(Duration.ofHours(1))
                    .setUpdateType(StateTtlConfig.UpdateType.OnCreateAndWrite)
                    .setStateVisibility(StateTtlConfig.StateVisibility.NeverReturnExpired)
                    .build());
            lastSeen = getRuntimeContext().getState(ls);
        }

        @Override
        public void processElement(Txn t, Context ctx, Collector<String> out) throws Exception {
            Long tot = total.value();
            long nt = (tot == null ? 0L : tot) + t.amount;
            total.update(nt);

            Long c = merchants.get(t.merchant);
            merchants.put(t.merchant, c == null ? 1L : c + 1L);

            ArrayList<Long> cur = new ArrayList<>();
            Iterable<Long> it = recent.get();
            if (it != null) {
                for (Long x : it) cur.add(x);
            }
            if (cur.size() < 5) {
                recent.add(t.amount);          // RocksDB: merge operand
                cur.add(t.amount);
            } else {
                cur.add(t.amount);
                while (cur.size() > 5) cur.remove(0);
                recent.update(cur);            // RocksDB: full put
            }
            lastSeen.update(t.ts);

            Object key = ctx.getCurrentKey();
            Mirror m = mirror.computeIfAbsent(key, x -> new Mirror());
            m.total = nt;
            m.merchants.put(t.merchant, c == null ? 1L : c + 1L);
            m.recent = new ArrayList<>(cur);
            m.lastSeen = t.ts;
            out.collect(key + "," + nt);
        }

        @Override
        public void snapshotState(FunctionSnapshotContext ctx) throws Exception {
            int sub = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
            Path dir = Paths.get(shadowDir);
            Files.createDirectories(dir);
            Path tmp = dir.resolve(ctx.getCheckpointId() + "-" + sub + ".tmp");
            try (Writer w = new BufferedWriter(new OutputStreamWriter(Files.newOutputStream(tmp), StandardCharsets.UTF_8))) {
                for (Map.Entry<Object, Mirror> e : mirror.entrySet()) {
                    Mirror m = e.getValue();
                    StringBuilder sb = new StringBuilder("{\"key\": ");
                    Object k = e.getKey();
                    if (k instanceof String) sb.append(jsonString((String) k)); else sb.append(k);
                    sb.append(", \"subtask\": ").append(sub);
                    sb.append(", \"total\": ").append(m.total).append(", \"merchants\": {");
                    boolean first = true;
                    for (Map.Entry<String, Long> me : m.merchants.entrySet()) {
                        if (!first) sb.append(", ");
                        first = false;
                        sb.append(jsonString(me.getKey())).append(": ").append(me.getValue());
                    }
                    sb.append("}, \"recent\": ").append(m.recent.toString());
                    sb.append(", \"lastSeen\": ").append(m.lastSeen).append("}\n");
                    w.write(sb.toString());
                }
            }
            Files.move(tmp, dir.resolve(ctx.getCheckpointId() + "-" + sub + ".jsonl"), StandardCopyOption.ATOMIC_MOVE);
        }
    }

    static String jsonString(String s) {
        StringBuilder sb = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char ch = s.charAt(i);
            if (ch == '"' || ch == '\\') sb.append('\\').append(ch);
            else if (ch < 0x20 || ch > 0x7e) sb.append(String.format("\\u%04x", (int) ch));
            else sb.append(ch);
        }
        return sb.append('"').toString();
    }

    static Map<String, String> parseArgs(String[] a) {
        Map<String, String> m = new HashMap<>();
        for (int i = 0; i < a.length; i += 2) m.put(a[i].replaceFirst("^--", ""), a[i + 1]);
        return m;
    }

    /** Highest id N with chk-N/_metadata present under the job's checkpoint directory. */
    static long latestCompleted(Path jobDir) throws IOException {
        long best = -1;
        if (!Files.isDirectory(jobDir)) return best;
        try (DirectoryStream<Path> ds = Files.newDirectoryStream(jobDir, "chk-*")) {
            for (Path p : ds) {
                if (Files.exists(p.resolve("_metadata"))) {
                    best = Math.max(best, Long.parseLong(p.getFileName().toString().substring(4)));
                }
            }
        }
        return best;
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> a = parseArgs(argv);
        String backend = a.get("backend");
        String keyType = a.get("key-type");
        String out = new File(a.get("out")).getAbsolutePath();
        int numKeys = Integer.parseInt(a.get("keys"));
        int maxP = Integer.parseInt(a.get("max-parallelism"));
        int p = Integer.parseInt(a.get("parallelism"));
        int retained = Integer.parseInt(a.get("retained"));
        double rate = Double.parseDouble(a.getOrDefault("rate-per-subtask", "1000"));
        long intervalMs = Long.parseLong(a.getOrDefault("interval-ms", "1500"));
        String plan = a.get("plan");

        Configuration conf = new Configuration();
        conf.setString("state.backend.type", backend);
        conf.setString("execution.checkpointing.incremental", "true");
        conf.setString("execution.checkpointing.dir", "file://" + out + "/checkpoints");
        conf.setString("execution.checkpointing.savepoint-dir", "file://" + out + "/savepoints");
        conf.setString("execution.checkpointing.interval", intervalMs + " ms");
        conf.setString("execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION");
        conf.setString("execution.checkpointing.num-retained", String.valueOf(retained));
        conf.setString("pipeline.max-parallelism", String.valueOf(maxP));
        conf.setString("parallelism.default", String.valueOf(p));
        conf.setString("rest.bind-port", "0");
        // the same settings under Flink 1.x's names
        conf.setString("state.backend.incremental", "true");
        conf.setString("state.checkpoints.dir", "file://" + out + "/checkpoints");
        conf.setString("state.savepoints.dir", "file://" + out + "/savepoints");
        conf.setString("state.checkpoints.num-retained", String.valueOf(retained));
        if (a.containsKey("inline-threshold")) {
            // execution.checkpointing.data-inline-threshold (default 20 kb): smaller state is inlined in _metadata
            conf.setString("execution.checkpointing.data-inline-threshold", a.get("inline-threshold"));
        }

        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(p, conf);
        env.setParallelism(p);
        env.setMaxParallelism(maxP);

        DataGeneratorSource<Txn> src = new DataGeneratorSource<>(
                new Gen(p, numKeys), PER * p, RateLimiterStrategy.perSecond(rate * p), TypeInformation.of(Txn.class));
        DataStream<Txn> txns = env.fromSource(src, WatermarkStrategy.noWatermarks(), "txn-source").uid("txn-source");

        String shadow = out + "/shadow";
        DataStream<String> res;
        if (keyType.equals("string")) {
            res = txns.keyBy(t -> t.card, Types.STRING).process(new Agg<String>(shadow), Types.STRING)
                    .name("aggregate").uid("agg");
        } else {
            res = txns.keyBy(t -> t.account, Types.LONG).process(new Agg<Long>(shadow), Types.STRING)
                    .name("aggregate").uid("agg");
        }
        res.sinkTo(new DiscardingSink<>()).name("discard").uid("sink");

        long t0 = System.currentTimeMillis();
        JobClient client = env.executeAsync("state-fixture-" + backend + "-" + keyType);
        Path jobDir = Paths.get(out, "checkpoints", client.getJobID().toHexString());
        System.out.println("JOB " + client.getJobID() + " dir " + jobDir + " start_ms " + t0);
        for (String step : plan.split(",")) {
            String[] kv = step.split(":");
            long after = Long.parseLong(kv[0]);
            while (latestCompleted(jobDir) < after) {
                Thread.sleep(50);
                if (System.currentTimeMillis() - t0 > 180_000) throw new IllegalStateException("timeout");
            }
            switch (kv[1]) {
                case "C": {
                    String sp = client.triggerSavepoint(out + "/savepoints", SavepointFormatType.CANONICAL).get(60, TimeUnit.SECONDS);
                    System.out.println("SAVEPOINT CANONICAL " + sp + " at_ms " + System.currentTimeMillis());
                    break;
                }
                case "N": {
                    String sp = client.triggerSavepoint(out + "/savepoints", SavepointFormatType.NATIVE).get(60, TimeUnit.SECONDS);
                    System.out.println("SAVEPOINT NATIVE " + sp + " at_ms " + System.currentTimeMillis());
                    break;
                }
                case "X": {
                    client.cancel().get(60, TimeUnit.SECONDS);
                    System.out.println("CANCELLED at_ms " + System.currentTimeMillis() + " latest " + latestCompleted(jobDir));
                    break;
                }
                default:
                    throw new IllegalArgumentException(step);
            }
        }
        try {
            client.getJobExecutionResult().get(30, TimeUnit.SECONDS);
        } catch (Exception e) {
            System.out.println("job ended: " + e.getClass().getSimpleName());
        }
        System.out.println("END_MS " + System.currentTimeMillis());
        System.exit(0);
    }
}
