// Test harness for the Flink savepoint writer (tests/flink/test_rewrite_flink.py on Flink 2.3,
// test_rewrite_flink_1_20.py on 1.20: it compiles against either, so it uses only the API both
// have): one program, the first argument is the mode. Runs on a MiniCluster in this JVM
// (createLocalEnvironment).
//
//   produce  --backend B --maxp M --p P --n N --out DIR --kind canonical|native|checkpoint
//            A DataStream job (source uid "src", keyed operators "agg-str" (String keys) and
//            "agg-long" (Long keys), sink "sink") processes exactly N records (the source emits
//            N per checkpoint), then takes the snapshot; prints "SNAPSHOT <path>".
//   restore  --backend B --maxp M --p P --from DIR --keys FILE --dump DIR --expect L
//            [--allow-non-restored true] [--uid-str U] [--uid-long U]
//            The same job restored from DIR: the source continues after the N records with one
//            probe record per key of FILE ("s:<key>" or "l:<number>"); each keyed operator
//            writes the probed key's whole state as a JSON line, and every event-time timer
//            that fires (the probes carry a watermark past all of them) as a line, into DIR;
//            ends when L lines are written.
//   sql      --backend B --maxp M --p P --n N --out DIR --phase first|restore|full [--from DIR]
//            A Flink SQL GROUP BY over the same gated source: "first" takes a canonical savepoint
//            after N records, "restore" continues from one for N more, "full" runs all 2N
//            records without interruption; the sink writes every changelog row to DIR/rows.
//   hash     reads "type:value" lines on stdin, prints each value's Java hashCode.
//   batch FILE  runs each line of FILE ("NAME<TAB>mode<TAB>--arg<TAB>value...") in turn, in
//            this one JVM; prints "RUN NAME" and "DONE NAME" around each run's own output.

import org.apache.flink.api.common.eventtime.*;
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
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.ProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.table.api.Table;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.runtime.typeutils.RowDataSerializer;
import org.apache.flink.table.types.logical.BigIntType;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.table.types.logical.VarCharType;
import org.apache.flink.types.Row;
import org.apache.flink.types.RowKind;
import org.apache.flink.util.Collector;

import java.io.*;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.TimeUnit;

public class RewriteHarness {
    static final long PROBE_TS = Long.MAX_VALUE / 2;
    static final String[] MERCHANTS = {"amazon", "café", "京东", "🍕-pizza", "shell"};

    static long mix64(long z) {
        z += 0x9E3779B97F4A7C15L;
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }

    static String card(int k) {
        if (k % 7 == 0) return "kärte-" + k;
        if (k % 11 == 0) return "🍕" + k;
        return "card-" + k;
    }

    static long account(int k) {
        long v = k % 2 == 0 ? 1L + 10L * k : 4_294_967_296L * (1 + (k % 5)) + 13L * k;
        return k % 3 == 0 ? -v : v;
    }

    public static class Txn implements Serializable {
        public String card;
        public long account;
        public long amount;
        public String merchant;
        public long ts;
        public int probe; // 0 record, 1 probe of card, 2 probe of account, 3 nothing
        public Txn() {}
    }

    /** Without probes: record i. With probes (restore mode): the j-th index after the first one
     *  the restored source emits is the probe of key j (nothing past the last key). */
    public static class Gen implements GeneratorFunction<Long, Txn> {
        final int n, keys;
        final List<String> probes;
        final String marker;
        transient Long first; // null until the first index (transient: not serialized)
        Gen(int n, int keys, List<String> probes, String marker) {
            this.n = n; this.keys = keys; this.probes = probes; this.marker = marker;
        }
        @Override
        public Txn map(Long idx) throws Exception {
            long i = idx;
            Txn t = new Txn();
            if (marker != null && (i == n - 1 || i == 2L * n - 1)) {
                Files.writeString(Paths.get(marker + "-" + i), "x");
            }
            if (probes == null) {
                int k = (int) ((mix64(i) >>> 1) % keys);
                t.card = card(k);
                t.account = account(k);
                t.amount = 1 + (mix64(i ^ 0x5DEECE66DL) >>> 1) % 1000;
                t.merchant = MERCHANTS[(int) ((mix64(i * 31 + 7) >>> 1) % MERCHANTS.length)];
                t.ts = 1000 + i;
                return t;
            }
            if (first == null) first = i;
            long j = i - first;
            t.ts = PROBE_TS;
            t.card = "";
            t.account = Long.MIN_VALUE;
            t.merchant = "";
            if (j >= probes.size()) {
                t.probe = 3;
            } else if (probes.get((int) j).startsWith("s:")) {
                t.probe = 1;
                t.card = probes.get((int) j).substring(2);
            } else {
                t.probe = 2;
                t.account = Long.parseLong(probes.get((int) j).substring(2));
            }
            return t;
        }
    }

    static StateTtlConfig ttl() {
        return StateTtlConfig.newBuilder(Duration.ofDays(3650))
                .setUpdateType(StateTtlConfig.UpdateType.OnCreateAndWrite)
                .setStateVisibility(StateTtlConfig.StateVisibility.NeverReturnExpired)
                .build();
    }

    public static class Agg<K> extends KeyedProcessFunction<K, Txn, String> {
        final String uid, dump;
        final int mine;
        transient ValueState<Long> total;
        transient MapState<String, Long> merchants;
        transient ListState<Long> recent;
        transient ValueState<Long> lastSeen;
        transient ListState<Long> seen;
        transient MapState<String, Long> perMerchant;
        transient Writer out;

        Agg(String uid, int mine, String dump) { this.uid = uid; this.mine = mine; this.dump = dump; }

        @Override
        public void open(OpenContext ctx) throws Exception {
            total = getRuntimeContext().getState(new ValueStateDescriptor<>("total", Types.LONG));
            merchants = getRuntimeContext().getMapState(new MapStateDescriptor<>("merchants", Types.STRING, Types.LONG));
            recent = getRuntimeContext().getListState(new ListStateDescriptor<>("recent", Types.LONG));
            ValueStateDescriptor<Long> ls = new ValueStateDescriptor<>("lastSeen", Types.LONG);
            ls.enableTimeToLive(ttl());
            lastSeen = getRuntimeContext().getState(ls);
            ListStateDescriptor<Long> sd = new ListStateDescriptor<>("seen", Types.LONG);
            sd.enableTimeToLive(ttl());
            seen = getRuntimeContext().getListState(sd);
            MapStateDescriptor<String, Long> pm = new MapStateDescriptor<>("perMerchant", Types.STRING, Types.LONG);
            pm.enableTimeToLive(ttl());
            perMerchant = getRuntimeContext().getMapState(pm);
            if (dump != null) {
                int sub = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
                Files.createDirectories(Paths.get(dump));
                out = new OutputStreamWriter(new FileOutputStream(dump + "/" + uid + "-" + sub + ".jsonl", true), StandardCharsets.UTF_8);
            }
        }

        @Override
        public void processElement(Txn t, Context ctx, Collector<String> o) throws Exception {
            if (t.probe == mine) {
                dumpState(ctx.getCurrentKey());
                return;
            }
            if (t.probe != 0) return;
            Long tot = total.value();
            if (tot == null) ctx.timerService().registerEventTimeTimer(t.ts + 1_000_000);
            total.update((tot == null ? 0L : tot) + t.amount);
            Long c = merchants.get(t.merchant);
            merchants.put(t.merchant, c == null ? 1L : c + 1L);
            recent.add(t.amount);
            lastSeen.update(t.ts);
            if (t.amount % 2 == 0) seen.add(t.amount);
            if (t.amount % 3 != 0) perMerchant.put(t.merchant, t.amount);
            o.collect("");
        }

        @Override
        public void onTimer(long ts, OnTimerContext ctx, Collector<String> o) throws Exception {
            if (out != null) {
                out.write("{\"timer\": " + ts + ", \"key\": " + json(ctx.getCurrentKey()) + "}\n");
                out.flush();
            }
        }

        void dumpState(Object key) throws Exception {
            StringBuilder sb = new StringBuilder("{\"key\": ").append(json(key));
            sb.append(", \"total\": ").append(total.value());
            sb.append(", \"merchants\": ").append(mapJson(merchants));
            sb.append(", \"recent\": ").append(listJson(recent.get()));
            sb.append(", \"lastSeen\": ").append(lastSeen.value());
            sb.append(", \"seen\": ").append(listJson(seen.get()));
            sb.append(", \"perMerchant\": ").append(mapJson(perMerchant)).append("}\n");
            out.write(sb.toString());
            out.flush();
        }
    }

    static String listJson(Iterable<Long> it) {
        List<String> parts = new ArrayList<>();
        if (it != null) for (Long x : it) parts.add(String.valueOf(x));
        return "[" + String.join(", ", parts) + "]";
    }

    static String mapJson(MapState<String, Long> m) throws Exception {
        List<String> parts = new ArrayList<>();
        for (Map.Entry<String, Long> e : m.entries()) parts.add(json(e.getKey()) + ": " + e.getValue());
        return "{" + String.join(", ", parts) + "}";
    }

    static String json(Object o) {
        if (!(o instanceof String)) return String.valueOf(o);
        String s = (String) o;
        StringBuilder sb = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char ch = s.charAt(i);
            if (ch == '"' || ch == '\\') sb.append('\\').append(ch);
            else if (ch < 0x20 || ch > 0x7e) sb.append(String.format("\\u%04x", (int) ch));
            else sb.append(ch);
        }
        return sb.append('"').toString();
    }

    static Map<String, String> args(String[] a) {
        Map<String, String> m = new HashMap<>();
        for (int i = 1; i + 1 < a.length; i += 2) m.put(a[i].replaceFirst("^--", ""), a[i + 1]);
        return m;
    }

    static Configuration conf(Map<String, String> a, String out) {
        Configuration conf = new Configuration();
        conf.setString("state.backend.type", a.get("backend"));
        conf.setString("execution.checkpointing.incremental", "true");
        conf.setString("rest.bind-port", "0");
        conf.setString("pipeline.max-parallelism", a.get("maxp"));
        conf.setString("taskmanager.numberOfTaskSlots", "8");
        if (out != null) {
            conf.setString("execution.checkpointing.dir", "file://" + out + "/checkpoints");
            conf.setString("execution.checkpointing.savepoint-dir", "file://" + out + "/savepoints");
        }
        if (a.containsKey("from")) {
            conf.setString("execution.state-recovery.path", a.get("from"));
            conf.setString("execution.state-recovery.ignore-unclaimed-state", a.getOrDefault("allow-non-restored", "false"));
        }
        return conf;
    }

    static void waitFor(String what, java.util.concurrent.Callable<Boolean> done, JobClient client) throws Exception {
        long t0 = System.currentTimeMillis();
        while (!done.call()) {
            if (client.getJobStatus().get().isGloballyTerminalState()) {
                client.getJobExecutionResult().get();
                throw new IllegalStateException("job ended before " + what);
            }
            if (System.currentTimeMillis() - t0 > 240_000) throw new IllegalStateException("timeout: " + what);
            Thread.sleep(50);
        }
    }

    /** A savepoint; retried while Flink declines it (tasks of the job still deploying). */
    static String savepoint(JobClient client, String dir, SavepointFormatType fmt) throws Exception {
        for (int attempt = 0; ; attempt++) {
            try {
                return client.triggerSavepoint(dir, fmt).get(120, TimeUnit.SECONDS);
            } catch (java.util.concurrent.ExecutionException e) {
                if (attempt >= 100) throw e;
                Thread.sleep(200);
            }
        }
    }

    static long latestCompleted(Path jobDir) throws IOException {
        long best = -1;
        if (!Files.isDirectory(jobDir)) return best;
        try (DirectoryStream<Path> ds = Files.newDirectoryStream(jobDir, "chk-*")) {
            for (Path p : ds) {
                if (Files.exists(p.resolve("_metadata"))) best = Math.max(best, Long.parseLong(p.getFileName().toString().substring(4)));
            }
        }
        return best;
    }

    static DataStream<Txn> source(StreamExecutionEnvironment env, int n, List<String> probes, String marker, boolean watermarks) {
        return source(env, n, n, probes, marker, watermarks);
    }

    /** The generator, emitting {@code gate} records per checkpoint (the first batch at once). */
    static DataStream<Txn> source(StreamExecutionEnvironment env, int n, int gate, List<String> probes, String marker, boolean watermarks) {
        DataGeneratorSource<Txn> src = new DataGeneratorSource<>(
                new Gen(n, Math.max(1, n / 4), probes, marker), 1_000_000_000L,
                RateLimiterStrategy.perCheckpoint(gate), TypeInformation.of(Txn.class));
        WatermarkStrategy<Txn> ws = watermarks
                ? WatermarkStrategy.<Txn>forGenerator(c -> new WatermarkGenerator<Txn>() {
                    public void onEvent(Txn t, long ts, WatermarkOutput out) { if (t.probe != 0) out.emitWatermark(new Watermark(PROBE_TS)); }
                    public void onPeriodicEmit(WatermarkOutput out) {}
                }).withTimestampAssigner((t, ts) -> t.ts)
                : WatermarkStrategy.noWatermarks();
        return env.fromSource(src, ws, "src").uid("src").setParallelism(1);
    }

    static void job(StreamExecutionEnvironment env, DataStream<Txn> txns, Map<String, String> a, String dump) {
        String us = a.getOrDefault("uid-str", "agg-str"), ul = a.getOrDefault("uid-long", "agg-long");
        DataStream<String> s1 = txns.keyBy(t -> t.card, Types.STRING).process(new Agg<String>(us, 1, dump), Types.STRING).name("agg-str").uid(us);
        DataStream<String> s2 = txns.keyBy(t -> t.account, Types.LONG).process(new Agg<Long>(ul, 2, dump), Types.STRING).name("agg-long").uid(ul);
        s1.union(s2).sinkTo(new DiscardingSink<>()).name("sink").uid("sink");
    }

    public static void main(String[] argv) throws Exception {
        if (argv[0].equals("hash")) { hash(); return; }
        try {
            if (argv[0].equals("batch")) {
                // one run per line of the file: "NAME<TAB>mode<TAB>--arg<TAB>value...", in this JVM
                for (String line : Files.readAllLines(Paths.get(argv[1]), StandardCharsets.UTF_8)) {
                    if (line.isBlank()) continue;
                    String[] f = line.split("\t");
                    System.out.println("RUN " + f[0]);
                    run(Arrays.copyOfRange(f, 1, f.length));
                    System.out.println("DONE " + f[0]);
                }
            } else {
                run(argv);
            }
        } catch (Throwable e) {
            e.printStackTrace();
            System.exit(1); // the MiniCluster's threads would keep the JVM alive
        }
        System.exit(0);
    }

    static void run(String[] argv) throws Exception {
        String mode = argv[0];
        Map<String, String> a = args(argv);
        int p = Integer.parseInt(a.get("p"));
        int maxp = Integer.parseInt(a.get("maxp"));
        if (mode.equals("produce")) produce(a, p, maxp);
        else if (mode.equals("restore")) restore(a, p, maxp);
        else if (mode.equals("sql")) sql(a, p, maxp);
        else throw new IllegalArgumentException(mode);
    }

    static void produce(Map<String, String> a, int p, int maxp) throws Exception {
        String out = new File(a.get("out")).getAbsolutePath();
        int n = Integer.parseInt(a.get("n"));
        String kind = a.get("kind");
        Configuration conf = conf(a, out);
        if (kind.equals("checkpoint")) {
            conf.setString("execution.checkpointing.interval", "300 ms");
            conf.setString("execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION");
            conf.setString("execution.checkpointing.num-retained", "3");
            conf.setString("execution.checkpointing.data-inline-threshold", "1kb");
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(p, conf);
        env.setMaxParallelism(maxp);
        String marker = out + "/marker";
        Files.createDirectories(Paths.get(out));
        job(env, source(env, n, null, marker, false), a, null);
        JobClient client = env.executeAsync("produce");
        if (kind.equals("checkpoint")) {
            Path jobDir = Paths.get(out, "checkpoints", client.getJobID().toHexString());
            waitFor("3 checkpoints", () -> latestCompleted(jobDir) >= 3, client);
            client.cancel().get(60, TimeUnit.SECONDS);
            System.out.println("SNAPSHOT " + jobDir.resolve("chk-" + latestCompleted(jobDir)));
            return;
        }
        waitFor("the first N records", () -> Files.exists(Paths.get(marker + "-" + (n - 1))), client);
        SavepointFormatType fmt = kind.equals("native") ? SavepointFormatType.NATIVE : SavepointFormatType.CANONICAL;
        String sp = savepoint(client, out + "/savepoints", fmt);
        client.cancel().get(60, TimeUnit.SECONDS);
        System.out.println("SNAPSHOT " + sp.replaceFirst("^file:", ""));
    }

    static long lines(Path dir) throws IOException {
        long n = 0;
        if (!Files.isDirectory(dir)) return 0;
        try (DirectoryStream<Path> ds = Files.newDirectoryStream(dir, "*.jsonl")) {
            for (Path f : ds) n += Files.readAllLines(f, StandardCharsets.UTF_8).size();
        }
        return n;
    }

    static void restore(Map<String, String> a, int p, int maxp) throws Exception {
        Configuration conf = conf(a, null);
        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(p, conf);
        env.setMaxParallelism(maxp);
        List<String> probes = Files.readAllLines(Paths.get(a.get("keys")), StandardCharsets.UTF_8);
        int n = Integer.parseInt(a.get("n"));
        String dump = new File(a.get("dump")).getAbsolutePath();
        job(env, source(env, n, probes, null, true), a, dump);
        JobClient client = env.executeAsync("restore");
        long expect = Long.parseLong(a.get("expect"));
        waitFor(expect + " lines", () -> lines(Paths.get(dump)) >= expect, client);
        client.cancel().get(60, TimeUnit.SECONDS);
        System.out.println("LINES " + lines(Paths.get(dump)));
    }

    // --- Flink SQL ---

    /** Writes every changelog row it gets to DIR/rows-SUBTASK.txt and emits nothing (a process
     *  function before a discarding sink: Flink 2.x moved SinkFunction, 1.20 has it elsewhere). */
    public static class RowWriter extends ProcessFunction<Row, String> {
        final String dir;
        transient Writer w;
        RowWriter(String dir) { this.dir = dir; }
        @Override
        public void open(OpenContext ctx) throws Exception {
            Files.createDirectories(Paths.get(dir));
            int sub = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
            w = new OutputStreamWriter(new FileOutputStream(dir + "/rows-" + sub + ".txt", true), StandardCharsets.UTF_8);
        }
        @Override
        public void processElement(Row r, Context ctx, Collector<String> o) throws Exception {
            w.write(r.getKind().shortString() + "\t" + r.getField(0) + "\t" + r.getField(1) + "\t" + r.getField(2) + "\n");
            w.flush();
        }
    }

    static void sql(Map<String, String> a, int p, int maxp) throws Exception {
        String out = new File(a.get("out")).getAbsolutePath();
        int n = Integer.parseInt(a.get("n"));
        String phase = a.get("phase");
        Configuration conf = conf(a, out);
        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(p, conf);
        env.setMaxParallelism(maxp);
        StreamTableEnvironment t = StreamTableEnvironment.create(env);
        String marker = out + "/marker";
        Files.createDirectories(Paths.get(out));
        // the uninterrupted run takes all 2N records in one gate cycle
        DataStream<Row> rows = source(env, n, phase.equals("full") ? 2 * n : n, null, marker, false)
                .map(x -> Row.of(x.card, x.amount), Types.ROW_NAMED(new String[] {"k", "v"}, Types.STRING, Types.LONG))
                .uid("to-row");
        t.createTemporaryView("txn", t.fromDataStream(rows));
        Table agg = t.sqlQuery("SELECT k, COUNT(*) AS c, SUM(v) AS s FROM txn GROUP BY k");
        t.toChangelogStream(agg).process(new RowWriter(out + "/rows"), Types.STRING).uid("rows-sink").name("rows-sink")
                .sinkTo(new DiscardingSink<>()).uid("rows-discard").name("rows-discard");
        JobClient client = env.executeAsync("sql-" + phase);
        long last = phase.equals("first") ? n - 1 : 2L * n - 1;
        waitFor("record " + last, () -> Files.exists(Paths.get(marker + "-" + last)), client);
        // its barrier follows the last record: once complete, every row has been written
        String sp = savepoint(client, out + "/savepoints", SavepointFormatType.CANONICAL);
        client.cancel().get(60, TimeUnit.SECONDS);
        System.out.println("SNAPSHOT " + sp.replaceFirst("^file:", ""));
    }

    // --- hash codes ---

    static void hash() throws Exception {
        BufferedReader r = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        RowDataSerializer brow = new RowDataSerializer(new LogicalType[] {new VarCharType(VarCharType.MAX_LENGTH), new BigIntType()});
        while ((line = r.readLine()) != null) {
            int c = line.indexOf(':');
            String type = line.substring(0, c), v = unescape(line.substring(c + 1));
            Object o;
            switch (type) {
                case "string": o = v; break;
                case "long": o = Long.parseLong(v); break;
                case "int": o = Integer.parseInt(v); break;
                case "short": o = Short.parseShort(v); break;
                case "byte": o = Byte.parseByte(v); break;
                case "char": o = v.charAt(0); break;
                case "boolean": o = Boolean.parseBoolean(v); break;
                case "double": o = Double.parseDouble(v); break;
                case "float": o = Float.parseFloat(v); break;
                case "row": { String[] f = v.split(",", 2); o = Row.of(f[0], Long.parseLong(f[1])); break; }
                case "brow": {
                    String[] f = v.split(",", 2);
                    o = brow.toBinaryRow(GenericRowData.of(StringData.fromString(f[0]), Long.parseLong(f[1])));
                    break;
                }
                default: throw new IllegalArgumentException(type);
            }
            StringBuilder sb = new StringBuilder().append(o.hashCode());
            if (type.equals("brow")) {
                org.apache.flink.table.data.binary.BinaryRowData b = (org.apache.flink.table.data.binary.BinaryRowData) o;
                sb.append(' ').append(HexFormat.of().formatHex(org.apache.flink.table.data.binary.BinarySegmentUtils.copyToBytes(b.getSegments(), b.getOffset(), b.getSizeInBytes())));
            }
            System.out.println(sb);
        }
    }

    static String unescape(String s) {
        StringBuilder sb = new StringBuilder();
        for (int i = 0; i < s.length(); i++) {
            char ch = s.charAt(i);
            if (ch == '\\' && i + 5 < s.length() + 0 && s.charAt(i + 1) == 'u') {
                sb.append((char) Integer.parseInt(s.substring(i + 2, i + 6), 16));
                i += 5;
            } else sb.append(ch);
        }
        return sb.toString();
    }
}
