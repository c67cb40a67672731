//! Runs every scenario at the smallest scale (`tollgate-bench report --quick`: one run of 200 ms
//! per point) against real servers — the tollgate binary, a redis-server, a Redis Cluster of
//! three masters and three replicas, redis-benchmark — and checks that the results and the
//! report are well formed and their numbers sane. Nothing here asserts on timing: a slow machine
//! gives small numbers, never a failure.
//!
//! The scenarios run the `tollgate` binary cargo built beside this test (`cargo test
//! --workspace` builds it; with `-p tollgate-bench` alone, build it first with `cargo build
//! --bin tollgate`, or set `$TOLLGATE_BIN`).

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate-bench"))
        .args(args)
        // limitador-server is built by hand from its repository; these runs never have one.
        .env_remove("LIMITADOR_SERVER")
        .output()
        .expect("run tollgate-bench")
}

fn assert_success(output: &Output) {
    assert!(
        output.status.success(),
        "tollgate-bench failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The JSON lines of one scenario, each checked to be an object naming its scenario and kind.
fn records(dir: &Path, scenario: &str) -> Vec<Value> {
    let path = dir.join(format!("{scenario}.jsonl"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
    let records: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|err| panic!("{line}: {err}")))
        .collect();
    for record in &records {
        assert_eq!(record["scenario"], scenario, "{record}");
        assert!(record["kind"].is_string(), "{record}");
    }
    let conditions: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "conditions")
        .collect();
    assert_eq!(conditions.len(), 1, "{scenario}: one conditions record");
    assert_eq!(conditions[0]["quick"], true);
    assert_eq!(conditions[0]["runs"], 1);
    assert!(conditions[0]["machine"]["cpus"].as_u64().unwrap() >= 1);
    records
}

fn of_kind<'a>(records: &'a [Value], kind: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["kind"] == kind).collect()
}

fn number(value: &Value, path: &[&str]) -> f64 {
    let mut at = value;
    for key in path {
        at = &at[*key];
    }
    at.as_f64()
        .unwrap_or_else(|| panic!("{} is not a number in {value}", path.join(".")))
}

/// The rows of the Markdown table that follows the line containing `heading` in `doc`, as cells.
fn table_after(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("`{heading}` is not in the report:\n{doc}"));
    let rows: Vec<Vec<String>> = doc[start..]
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2) // header and rule
        .map(|line| {
            line.trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect();
    assert!(!rows.is_empty(), "no table after `{heading}`");
    rows
}

/// Whether perf can sample a process here: the check the `profile` scenario makes before it
/// runs, made again by the test to know which outcome to require.
fn perf_can_sample() -> bool {
    let dir = tempfile::tempdir().unwrap();
    Command::new("perf")
        .args(["record", "--quiet", "--output"])
        .arg(dir.path().join("probe.data"))
        .args(["--", "true"])
        .output()
        .is_ok_and(|output| output.status.success())
}

/// Whether valgrind's callgrind and its control program are installed, as the `instructions`
/// scenario needs.
fn callgrind_installed() -> bool {
    ["valgrind", "callgrind_control"].iter().all(|tool| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|output| output.status.success())
    })
}

/// The flame graphs a report drew beside itself, by file name.
fn flame_graphs(beside: &Path) -> Vec<(String, String)> {
    let mut graphs: Vec<(String, String)> = std::fs::read_dir(beside.join("flamegraphs"))
        .map(|entries| {
            entries
                .map(|entry| {
                    let path = entry.unwrap().path();
                    let name = path.file_name().unwrap().to_string_lossy().into_owned();
                    (name, std::fs::read_to_string(&path).unwrap())
                })
                .collect()
        })
        .unwrap_or_default();
    graphs.sort();
    graphs
}

fn marker(name: &str, which: &str) -> String {
    match which {
        "begin" => format!(
            "<!-- tollgate-bench report: {name} begins; edits up to its end marker are overwritten -->"
        ),
        _ => format!("<!-- tollgate-bench report: {name} ends -->"),
    }
}

#[test]
fn quick_report_measures_every_scenario_and_keeps_the_hand_written_text() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    let out = dir.path().join("performance.md");
    std::fs::write(
        &out,
        format!(
            "# Performance\n\nWritten by hand before.\n\n{}\nstale numbers\n{}\n\nWritten by hand after.\n",
            marker("matrix", "begin"),
            marker("matrix", "end")
        ),
    )
    .unwrap();

    let output = bench(&[
        "report",
        "--quick",
        "--results-dir",
        results.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_success(&output);
    let perf = perf_can_sample();
    let callgrind = callgrind_installed();
    let doc = std::fs::read_to_string(&out).unwrap();

    // The hand-written text stays, the stale section is replaced, every section is there once.
    assert!(doc.contains("Written by hand before."), "{doc}");
    assert!(doc.contains("Written by hand after."), "{doc}");
    assert!(!doc.contains("stale numbers"), "{doc}");
    for name in [
        "machine",
        "matrix",
        "hotkey",
        "attack",
        "overload",
        "memory",
        "accuracy",
        "redis-cpu",
        "cost",
        "lease",
        "grpc-floor",
        "connections",
        "redis-bound",
        "workers",
    ]
    .into_iter()
    .chain(perf.then_some("profile"))
    .chain(callgrind.then_some("instructions"))
    {
        for which in ["begin", "end"] {
            assert_eq!(
                doc.matches(&marker(name, which)).count(),
                1,
                "{name} {which}"
            );
        }
    }
    assert!(doc.contains("A smoke run (`--quick`)"), "{doc}");
    // Without a limitador-server, that scenario is skipped by name, and says how to get one.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("skipping limitador, its section stays as it was: no limitador-server")
            && stderr.contains("cargo build --release -p limitador-server"),
        "{stderr}"
    );
    assert!(!doc.contains(&marker("limitador", "begin")), "{doc}");
    assert!(!results.join("limitador.jsonl").exists());

    // matrix: every backend × algorithm × shard count ran, peak and half, and decided.
    let matrix = records(&results, "matrix");
    let runs = of_kind(&matrix, "tollgate");
    for backend in ["memory", "redis", "redis-cluster"] {
        for algorithm in ["counter", "log"] {
            for shards in [1, 8] {
                for mode in ["peak", "half"] {
                    let run = runs
                        .iter()
                        .find(|r| {
                            r["backend"] == backend
                                && r["algorithm"] == algorithm
                                && r["shards"] == shards
                                && r["mode"] == mode
                        })
                        .unwrap_or_else(|| panic!("no {backend} {algorithm} {shards} {mode} run"));
                    assert!(number(run, &["load", "decisions"]) > 0.0, "{run}");
                    assert!(number(run, &["load", "ok"]) > 0.0, "{run}");
                    assert!(
                        number(run, &["load", "decisions_per_second"]) > 0.0,
                        "{run}"
                    );
                    assert!(number(run, &["tollgate_cpu_seconds"]) >= 0.0, "{run}");
                    let latency = &run["load"]["latency_us"];
                    assert!(
                        number(latency, &["p50"]) <= number(latency, &["p99"]),
                        "{run}"
                    );
                    if mode == "half" {
                        assert!(number(run, &["target_rate"]) > 0.0, "{run}");
                    }
                }
            }
        }
    }
    let ceilings = of_kind(&matrix, "ceiling");
    for backend in ["redis", "redis-cluster"] {
        for algorithm in ["counter", "log"] {
            let ceiling = ceilings
                .iter()
                .find(|r| r["backend"] == backend && r["algorithm"] == algorithm)
                .unwrap_or_else(|| panic!("no {backend} {algorithm} ceiling"));
            assert!(number(ceiling, &["calls_per_second"]) > 0.0, "{ceiling}");
            assert!(number(ceiling, &["requests"]) >= 1000.0, "{ceiling}");
            assert!(
                ceiling["command"]
                    .as_str()
                    .unwrap()
                    .starts_with("redis-benchmark "),
                "{ceiling}"
            );
        }
    }
    // Every ratio of the matrix has both of its numbers.
    for row in table_after(&doc, "#### Ratios") {
        assert!(row.iter().all(|cell| cell != "–"), "{row:?}");
        assert!(row[3].ends_with('×') && row[5].ends_with('%'), "{row:?}");
    }
    let peaks = table_after(&doc, "#### Peak: closed loop");
    assert_eq!(peaks.len(), 12, "{peaks:?}");

    // hotkey: unsharded, one master serves every script call; sharded, they spread.
    let hotkey = records(&results, "hotkey");
    let hot = of_kind(&hotkey, "run");
    for shards in [1, 8] {
        let run = hot
            .iter()
            .find(|r| r["shards"] == shards)
            .unwrap_or_else(|| panic!("no hotkey run with {shards} shards"));
        let masters = run["masters"].as_array().unwrap();
        assert_eq!(masters.len(), 3, "{run}");
        let calls: Vec<f64> = masters
            .iter()
            .map(|m| number(m, &["script_calls"]))
            .collect();
        let busy = calls.iter().filter(|c| **c > 0.0).count();
        assert!(
            calls.iter().sum::<f64>() >= number(run, &["load", "ok"]),
            "every admitted hit is a script call: {run}"
        );
        if shards == 1 {
            assert_eq!(busy, 1, "{run}");
        } else {
            assert!(busy >= 2, "{run}");
        }
    }
    let hot_rows = table_after(&doc, "### One hot limit");
    assert_eq!(hot_rows.len(), 2, "{hot_rows:?}");
    assert_eq!(hot_rows[0][5], "100%", "{hot_rows:?}");
    assert!(doc.contains("`shards: 8` over `shards: 1`"), "{doc}");

    // attack: refusals on every backend, with the local cache on and off; script calls counted
    // on the Redis ones, every refusal one call without the cache, fewer with it.
    let attack = records(&results, "attack");
    let attacks = of_kind(&attack, "run");
    for backend in ["memory", "redis", "redis-cluster"] {
        for cache in [true, false] {
            let run = attacks
                .iter()
                .find(|r| r["backend"] == backend && r["local_cache"] == cache)
                .unwrap_or_else(|| panic!("no attack run on {backend}, cache {cache}"));
            assert!(number(run, &["load", "over_limit"]) > 0.0, "{run}");
            assert_eq!(run["limit"], 100);
            assert_eq!(run["script_calls"].is_null(), backend == "memory", "{run}");
        }
    }
    let attack_rows = table_after(&doc, "### One key far over its limit");
    assert_eq!(attack_rows.len(), 6, "{attack_rows:?}");
    for pair in attack_rows[2..].chunks(2) {
        let calls =
            |row: &Vec<String>| -> f64 { row[6].parse().unwrap_or_else(|_| panic!("{row:?}")) };
        assert_eq!(
            (pair[0][1].as_str(), pair[1][1].as_str()),
            ("on", "off"),
            "{pair:?}"
        );
        assert!(
            calls(&pair[1]) >= 0.99,
            "every refusal is a call without the cache: {pair:?}"
        );
        assert!(calls(&pair[0]) < calls(&pair[1]), "{pair:?}");
    }

    // overload: every bound measured; refusals only where there is a bound.
    let overload = records(&results, "overload");
    let overloads = of_kind(&overload, "run");
    for bound in [0, 1024, 256, 64] {
        let run = overloads
            .iter()
            .find(|r| r["bound"] == bound)
            .unwrap_or_else(|| panic!("no overload run with bound {bound}"));
        assert!(number(run, &["saturation"]) > 0.0, "{run}");
        assert!(number(run, &["rss_after"]) > 0.0, "{run}");
    }
    assert_eq!(table_after(&doc, "### Twice the saturation rate").len(), 4);

    // memory: both algorithms, the budget held, idle readings after the flood.
    let memory = records(&results, "memory");
    for run in of_kind(&memory, "run") {
        let reading = &run["reading"];
        assert!(
            number(reading, &["bytes"]) <= number(reading, &["budget"]),
            "{run}"
        );
    }
    assert!(
        doc.contains("### A flood of distinct keys on the memory backend"),
        "{doc}"
    );

    // accuracy: the log never admits more than the limit in any window, whatever the traffic;
    // the counter's boundary burst goes well past it; a log key grows with its hits.
    let accuracy = records(&results, "accuracy");
    let simulated = of_kind(&accuracy, "run");
    assert!(simulated.len() >= 16, "{simulated:?}");
    for run in &simulated {
        let worst = number(run, &["worst_interval"]);
        if run["algorithm"] == "log" {
            assert!(worst <= 100.0, "{run}");
            assert_eq!(number(run, &["wrongly_admitted"]), 0.0, "{run}");
        }
        if run["algorithm"] == "counter" && run["pattern"].as_str().unwrap().starts_with("boundary")
        {
            assert!(worst > 150.0, "{run}");
        }
    }
    let bytes = of_kind(&accuracy, "bytes");
    for store in ["memory", "redis"] {
        let log = |hits: u64| {
            bytes
                .iter()
                .find(|r| r["store"] == store && r["algorithm"] == "log" && r["hits"] == hits)
                .map(|r| number(r, &["bytes"]))
                .unwrap_or_else(|| panic!("no {store} log key of {hits} hits"))
        };
        assert!(log(10_000) > log(100), "{bytes:?}");
    }
    assert!(doc.contains("### Accuracy of the algorithms"), "{doc}");

    // redis-cpu: both floors, and script time for every point.
    let redis_cpu = records(&results, "redis-cpu");
    let floors = of_kind(&redis_cpu, "floor");
    assert_eq!(floors.len(), 3, "{floors:?}");
    for floor in &floors {
        assert!(number(floor, &["usec_per_decision"]) > 0.0, "{floor}");
    }
    // 2 backends × 2 algorithms × 2 shard counts × (admitted with 1 and 3 descriptors, refused).
    let cpu_runs = of_kind(&redis_cpu, "run");
    assert_eq!(cpu_runs.len(), 24, "{cpu_runs:?}");
    for run in &cpu_runs {
        assert!(number(run, &["script_calls"]) > 0.0, "{run}");
        assert!(number(run, &["script_usec"]) > 0.0, "{run}");
        assert!(number(run, &["redis_cpu_seconds"]) >= 0.0, "{run}");
    }
    // A request's three limits are three script calls, on one server as on a cluster.
    for run in cpu_runs
        .iter()
        .filter(|r| r["mix"] == "admitted" && r["descriptors"] == 3 && r["shards"] == 1)
    {
        let decisions = number(run, &["load", "decisions"]);
        assert_eq!(number(run, &["script_calls"]), 3.0 * decisions, "{run}");
    }
    // How the script is called: four ways for each algorithm.
    let invocations = of_kind(&redis_cpu, "invocation");
    assert_eq!(invocations.len(), 8, "{invocations:?}");
    for run in &invocations {
        assert!(number(run, &["calls"]) > 0.0, "{run}");
        assert!(number(run, &["script_usec"]) > 0.0, "{run}");
    }
    assert_eq!(table_after(&doc, "### Redis CPU per decision").len(), 3);
    assert_eq!(table_after(&doc, "#### How the script is called").len(), 8);

    // connections: every pool size decided with one and with three descriptors, and each is
    // compared with the first.
    let connections = records(&results, "connections");
    let connection_runs = of_kind(&connections, "run");
    assert_eq!(connection_runs.len(), 8, "{connection_runs:?}");
    for run in &connection_runs {
        assert!(
            number(run, &["load", "decisions_per_second"]) > 0.0,
            "{run}"
        );
    }
    assert_eq!(
        table_after(&doc, "### Connections to one Redis server").len(),
        8
    );
    assert!(
        doc.contains("decisions/s of each pool size over 1 connection, the median"),
        "{doc}"
    );
    // redis-bound: both clients ran each algorithm against the throttled server, every tollgate
    // decision was one script call, and the ratio of their rates is written.
    let bound = records(&results, "redis-bound");
    let bound_runs = of_kind(&bound, "run");
    assert_eq!(bound_runs.len(), 4, "{bound_runs:?}");
    for run in &bound_runs {
        assert!(number(run, &["rate"]) > 0.0, "{run}");
        assert!(number(run, &["redis_cpu_seconds"]) > 0.0, "{run}");
        if run["client"] == "tollgate" {
            assert_eq!(
                number(run, &["script_calls"]),
                number(run, &["calls"]),
                "{run}"
            );
        }
    }
    assert_eq!(
        table_after(&doc, "### When Redis is what runs out").len(),
        4
    );
    for algorithm in ["counter", "log"] {
        assert!(
            doc.contains(&format!(
                "{algorithm}: tollgate's decisions/s over redis-benchmark's calls/s, the median"
            )),
            "{doc}"
        );
    }
    // workers: every layout decided closed loop and at the steady rate, its processes' context
    // switches were read, and each layout is compared with the default.
    let workers = records(&results, "workers");
    let worker_runs = of_kind(&workers, "run");
    assert_eq!(worker_runs.len(), 6, "{worker_runs:?}");
    for run in &worker_runs {
        assert!(
            number(run, &["load", "decisions_per_second"]) > 0.0,
            "{run}"
        );
        // Counted exactly, unlike CPU time (whole clock ticks, which a smoke run's few
        // milliseconds may round to none): a process that decided has waited at least once.
        assert!(number(run, &["context_switches"]) > 0.0, "{run}");
    }
    let per_cpu_processes = worker_runs
        .iter()
        .find(|r| r["layout"] == "process-per-cpu")
        .map(|r| number(r, &["processes"]));
    assert_eq!(
        per_cpu_processes,
        Some(std::thread::available_parallelism().map_or(1, usize::from) as f64)
    );
    assert_eq!(
        table_after(&doc, "### Worker threads on the Redis path").len(),
        6
    );
    for load in ["Closed loop", "At 20,000/s"] {
        assert!(
            doc.contains(&format!(
                "{load}, each layout over one process, a worker per CPU (default), the median"
            )),
            "{doc}"
        );
    }
    // cost: both tollgates decided, and the ratio of their throughputs is written.
    let cost = records(&results, "cost");
    let cost_runs = of_kind(&cost, "run");
    for mode in ["stats-off", "default"] {
        let run = cost_runs
            .iter()
            .find(|r| r["mode"] == mode)
            .unwrap_or_else(|| panic!("no cost run of {mode}"));
        assert!(
            number(run, &["load", "decisions_per_second"]) > 0.0,
            "{run}"
        );
        assert!(number(run, &["tollgate_cpu_seconds"]) >= 0.0, "{run}");
    }
    assert_eq!(
        table_after(&doc, "### The cost of the per-limit statistics").len(),
        2
    );
    assert!(
        doc.contains(
            "Throughput with the statistics over without, the median of the runs' ratios: "
        ),
        "{doc}"
    );

    // lease: three instances share the hot limit; on every store backend, leased and not, for
    // both algorithms. Unleased, every admitted hit is a script call; leased, fewer calls than
    // decisions. Under overload the log never admits more than its limit allows over the run
    // plus one window for calls answered after the schedule ended.
    let lease = records(&results, "lease");
    let throughput = of_kind(&lease, "throughput");
    for algorithm in ["counter", "log"] {
        let memory = throughput
            .iter()
            .find(|r| r["backend"] == "memory" && r["algorithm"] == algorithm)
            .unwrap_or_else(|| panic!("no memory {algorithm} lease run"));
        assert!(number(memory, &["load", "ok"]) > 0.0, "{memory}");
        assert!(memory["script_calls"].is_null(), "{memory}");
        for backend in ["redis", "redis-cluster"] {
            for leased in [false, true] {
                let run = throughput
                    .iter()
                    .find(|r| {
                        r["backend"] == backend
                            && r["algorithm"] == algorithm
                            && r["leased"] == leased
                    })
                    .unwrap_or_else(|| panic!("no {backend} {algorithm} leased={leased} run"));
                assert_eq!(run["instances"], 3, "{run}");
                let ok = number(run, &["load", "ok"]);
                let calls = number(run, &["script_calls"]);
                assert!(ok > 0.0, "{run}");
                if leased {
                    assert!(calls < ok, "leased hits are answered from slices: {run}");
                } else {
                    assert!(calls >= ok, "every unleased hit is a script call: {run}");
                }
            }
        }
    }
    let overloaded = of_kind(&lease, "overload");
    assert_eq!(overloaded.len(), 8, "{overloaded:?}");
    for run in &overloaded {
        assert!(number(run, &["load", "ok"]) > 0.0, "{run}");
        if run["algorithm"] == "log" {
            // A window's worth per window the run spans, and one more for calls answered
            // after the schedule ended.
            let allowed = number(run, &["limit_per_second"])
                * (number(run, &["duration_seconds"]).ceil() + 1.0);
            assert!(number(run, &["load", "ok"]) <= allowed, "{run}");
        }
    }
    assert_eq!(
        table_after(&doc, "### One hot limit shared by 3 instances").len(),
        10
    );
    assert_eq!(table_after(&doc, "#### Twice the limit").len(), 8);

    // grpc-floor: tollgate and the empty server both answered, closed loop, at half of
    // tollgate's peak and at the quiet rate, sharing the cores with the generator and (given a
    // second CPU) apart from it; the ratio and both open-loop tables are written.
    let floor = records(&results, "grpc-floor");
    let floor_cpus = floor
        .iter()
        .find(|r| r["kind"] == "conditions")
        .and_then(|r| r["machine"]["cpus"].as_u64())
        .unwrap();
    let apart_too = floor_cpus > 1;
    let floor_runs = of_kind(&floor, "run");
    assert_eq!(
        floor_runs.len(),
        if apart_too { 12 } else { 6 },
        "{floor_runs:?}"
    );
    let placements: &[bool] = if apart_too { &[false, true] } else { &[false] };
    for &apart in placements {
        for server in ["tollgate", "empty"] {
            for (open, quiet) in [(false, false), (true, false), (true, true)] {
                let run = floor_runs
                    .iter()
                    .find(|r| {
                        r["server"] == server
                            && r["target_rate"].is_null() != open
                            && r["quiet"] == quiet
                            && r["apart"] == apart
                    })
                    .unwrap_or_else(|| {
                        panic!(
                            "no grpc-floor run of {server}, open loop {open}, quiet {quiet}, \
                             apart {apart}"
                        )
                    });
                if quiet {
                    assert_eq!(number(run, &["target_rate"]), 2_000.0, "{run}");
                }
                assert!(number(run, &["load", "ok"]) > 0.0, "{run}");
                assert!(number(run, &["cpu_seconds"]) >= 0.0, "{run}");
                // Sending the calls costs the generator CPU, which it counts.
                assert!(number(run, &["generator_cpu_seconds"]) > 0.0, "{run}");
            }
        }
    }
    assert!(
        doc.contains("| server, open loop | target/s | achieved/s | p50 ms | p90 ms | p99 ms | p99.9 ms | server cores | generator cores |"),
        "{doc}"
    );
    assert_eq!(
        table_after(&doc, "### tollgate against an empty RLS server").len(),
        2
    );
    assert!(
        doc.contains("tollgate ÷ empty server, the median of the runs' ratios: "),
        "{doc}"
    );
    // Then both under h2load, each answering every call.
    let floor_h2load = of_kind(&floor, "h2load");
    for server in ["tollgate", "empty"] {
        let run = floor_h2load
            .iter()
            .find(|r| r["server"] == server)
            .unwrap_or_else(|| panic!("no grpc-floor h2load run of {server}: {floor_h2load:?}"));
        assert!(number(run, &["load", "succeeded"]) > 0.0, "{run}");
        assert_eq!(number(run, &["load", "failed"]), 0.0, "{run}");
        assert!(number(run, &["cpu_seconds"]) > 0.0, "{run}");
    }
    assert!(
        doc.contains("| server, h2load | decisions/s | min–max | mean ms | CPU µs/decision |"),
        "{doc}"
    );
    assert!(
        doc.contains("Under h2load, tollgate ÷ empty server, the median of the runs' ratios: "),
        "{doc}"
    );
    assert_eq!(
        table_after(&doc, "\nThe same two servers under h2load").len(),
        2
    );
    if apart_too {
        assert_eq!(
            table_after(&doc, "\nApart: a second tollgate and empty server").len(),
            2
        );
        assert!(
            doc.contains("| server, open loop, apart | target/s |"),
            "{doc}"
        );
    }

    // profile: perf sampled every server while it was measured, every sample counts in one
    // part, and a flame graph of each server was drawn beside the report. Where perf cannot
    // sample, the scenario is skipped by name and says why.
    if perf {
        let profile = records(&results, "profile");
        let runs = of_kind(&profile, "run");
        for server in ["tollgate-memory", "tollgate-redis", "empty"] {
            let run = runs
                .iter()
                .find(|r| r["server"] == server)
                .unwrap_or_else(|| panic!("no profile run of {server}"));
            assert!(number(run, &["load", "ok"]) > 0.0, "{run}");
            let parts = run["parts"].as_object().unwrap();
            let samples: u64 = parts.values().map(|n| n.as_u64().unwrap()).sum();
            assert!(samples > 0, "{run}");
            // Only tollgate on Redis has a Redis client to sample.
            if server != "tollgate-redis" {
                assert!(!parts.contains_key("redis-client"), "{run}");
            }
        }
        assert_eq!(
            table_after(&doc, "### Where a decision's CPU goes, sampled").len(),
            3
        );
        let graphs = flame_graphs(dir.path());
        let names: Vec<&str> = graphs.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            [
                "profile-empty.svg",
                "profile-tollgate-memory.svg",
                "profile-tollgate-redis.svg"
            ]
        );
        for (name, svg) in &graphs {
            assert!(svg.contains("<svg") && svg.contains("samples"), "{name}");
            assert!(doc.contains(&format!("(flamegraphs/{name})")), "{doc}");
        }
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("skipping profile, its section stays as it was: "),
            "{stderr}"
        );
    }

    // instructions: callgrind counted every server over the calls h2load sent it, and tollgate
    // executes more a call than the empty server. Without valgrind, the scenario is skipped by
    // name and says why.
    if callgrind {
        let counted = records(&results, "instructions");
        let runs = of_kind(&counted, "run");
        let per_call = |server: &str| {
            let run = runs
                .iter()
                .find(|r| r["server"] == server)
                .unwrap_or_else(|| panic!("no instructions run of {server}"));
            assert!(number(run, &["calls"]) >= 100.0, "{run}");
            number(run, &["instructions"]) / number(run, &["calls"])
        };
        // Every tollgate does more than the empty server on the same gRPC path, which does
        // less than the one tonic generates.
        let floor = per_call("empty-unary");
        assert!(floor > 0.0);
        assert!(per_call("empty") > floor);
        for server in [
            "tollgate",
            "tollgate-no-local-cache",
            "tollgate-no-stats",
            "tollgate-redis",
        ] {
            assert!(per_call(server) > floor, "{server}");
        }
        assert_eq!(
            table_after(&doc, "### Instructions per call, counted").len(),
            6
        );
        // And redis-server was counted over every script's calls: a decision does more than
        // the commands it would run with no decision between them.
        let scripts = of_kind(&counted, "script");
        let per_script = |script: &str| {
            let run = scripts
                .iter()
                .find(|r| r["script"] == script)
                .unwrap_or_else(|| panic!("no script run of {script}"));
            assert!(number(run, &["calls"]) >= 100.0, "{run}");
            number(run, &["instructions"]) / number(run, &["calls"])
        };
        assert!(per_script("log") > per_script("log-commands"));
        assert!(per_script("counter") > per_script("minimal"));
        assert!(per_script("log-commands-one-key") > 0.0);
        assert_eq!(
            table_after(&doc, "#### Instructions per script call, in redis-server").len(),
            5
        );
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("skipping instructions, its section stays as it was: "),
            "{stderr}"
        );
    }
    let graphs = flame_graphs(dir.path());

    // The report is a function of the results alone, the flame graphs too: drawn again from
    // the stacks kept with the results, they are the same files.
    let _ = std::fs::remove_dir_all(dir.path().join("flamegraphs"));
    let again = dir.path().join("again.md");
    std::fs::copy(&out, &again).unwrap();
    let output = bench(&[
        "report",
        "--render-only",
        "--results-dir",
        results.to_str().unwrap(),
        "--out",
        again.to_str().unwrap(),
    ]);
    assert_success(&output);
    assert_eq!(std::fs::read_to_string(&again).unwrap(), doc);
    assert!(
        flame_graphs(dir.path()) == graphs,
        "the flame graphs drawn again from the results are not the ones the report drew"
    );

    // A report of some scenarios leaves the machine section as the last whole report wrote it:
    // it speaks for sections this report does not measure.
    let begin = marker("machine", "begin");
    let start = doc.find(&begin).unwrap() + begin.len();
    let stop = doc.find(&marker("machine", "end")).unwrap();
    let partial = dir.path().join("partial.md");
    let by_hand = format!(
        "{}\nthe machine of the last whole report\n{}",
        &doc[..start],
        &doc[stop..]
    );
    std::fs::write(&partial, &by_hand).unwrap();
    let output = bench(&[
        "report",
        "--render-only",
        "--scenarios",
        "workers",
        "--results-dir",
        results.to_str().unwrap(),
        "--out",
        partial.to_str().unwrap(),
    ]);
    assert_success(&output);
    assert_eq!(std::fs::read_to_string(&partial).unwrap(), by_hand);
}

#[test]
fn bad_flags_and_missing_results_are_named() {
    let output = bench(&["matrix", "--backends", "postgres"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("postgres") && stderr.contains("--backends"),
        "{stderr}"
    );

    let output = bench(&["limitador", "--quick"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot run limitador: no limitador-server"),
        "{stderr}"
    );

    let output = bench(&["hotkey", "--shards", "0"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--shards"));

    // A steady rate of nothing would divide by zero in the schedule.
    let output = bench(&["workers", "--rate", "0"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--rate") && stderr.contains("must be a positive number"),
        "{stderr}"
    );

    let dir = tempfile::tempdir().unwrap();
    let output = bench(&[
        "report",
        "--render-only",
        "--scenarios",
        "attack",
        "--results-dir",
        dir.path().to_str().unwrap(),
        "--out",
        dir.path().join("out.md").to_str().unwrap(),
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("attack.jsonl"), "{stderr}");
}
