//! Runs every scenario once at the smallest scale (`tollgate-bench report --quick --scenarios
//! NAME`: one run of 200 ms per point), one `#[test]` per scenario so that the first failure does
//! not hide the rest, against real servers (the tollgate binary, a redis-server, a Redis
//! Cluster of three masters and three replicas, redis-benchmark, h2load, valgrind), and checks
//! that each one's results and report section are well formed and their numbers sane. Each test
//! keeps its results in a directory of its own, so tests running in parallel share nothing.
//! Nothing here asserts on timing: a slow machine gives small numbers, never a failure.
//!
//! This is where the scenarios `scripts/bench` runs are tested: the documentation shows that
//! command but does not run it (tests/docs.rs), and `every_scenario_has_its_own_test` keeps the
//! list here equal to `tollgate-bench list`.
//!
//! The scenarios run the `tollgate` binary cargo built beside this test (`cargo test
//! --workspace` builds it; with `-p tollgate-bench` alone, build it first with `cargo build
//! --bin tollgate`, or set `$TOLLGATE_BIN`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate-bench"))
        .args(args)
        // limitador-server is built by hand from its repository; these runs never have one.
        .env_remove("LIMITADOR_SERVER")
        .env_remove("TOLLGATE_BENCH_QUICK")
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

/// One scenario run at smoke scale into a directory of its own.
struct Smoke {
    /// Holds the results and the report until the test ends: bind it (`dir: _dir`), since a
    /// field left to `..` is dropped, and the directory with it, at once.
    dir: tempfile::TempDir,
    /// Where the JSON lines went.
    results: PathBuf,
    /// The report `report` wrote: the machine section and the scenario's.
    doc: String,
    /// What `report` said on standard error (which scenarios it skipped, and why).
    stderr: String,
}

/// Runs scenario `name` once (`report --quick --scenarios NAME`), checks that the report is a
/// function of the results alone (rendered again from them, it is the same text), and answers
/// what the run left.
fn smoke(name: &str) -> Smoke {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    let out = dir.path().join("performance.md");
    let report = |extra: &[&str], out: &Path| {
        let mut args = vec!["report", "--quick", "--scenarios", name, "--results-dir"];
        args.push(results.to_str().unwrap());
        args.extend(["--out", out.to_str().unwrap()]);
        args.extend(extra);
        bench(&args)
    };
    let output = report(&[], &out);
    assert_success(&output);
    let doc = std::fs::read_to_string(&out).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    // The scenario's section is there and not empty, unless the scenario was skipped.
    let empty = format!("{}\n{}", marker(name, "begin"), marker(name, "end"));
    assert!(
        doc.contains(&marker(name, "begin")) && !doc.contains(&empty)
            || stderr.contains(&format!("skipping {name}")),
        "{doc}"
    );
    if results.join(format!("{name}.jsonl")).exists() {
        let again = dir.path().join("again.md");
        assert_success(&report(&["--render-only"], &again));
        assert_eq!(std::fs::read_to_string(&again).unwrap(), doc, "{name}");
    }
    Smoke {
        dir,
        results,
        doc,
        stderr,
    }
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

fn marker(name: &str, which: &str) -> String {
    match which {
        "begin" => format!(
            "<!-- tollgate-bench report: {name} begins; edits up to its end marker are overwritten -->"
        ),
        _ => format!("<!-- tollgate-bench report: {name} ends -->"),
    }
}

/// The scenarios `tollgate-bench list` names: what `report` (and so `scripts/bench`) runs.
fn listed_scenarios() -> Vec<String> {
    let output = bench(&["list"]);
    assert_success(&output);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_scenario_has_its_own_test() {
    let listed = listed_scenarios();
    assert!(listed.contains(&"matrix".to_owned()), "{listed:?}");
    let source = include_str!("scenarios.rs");
    for name in &listed {
        let test = format!("#[test]\nfn {}() {{", name.replace('-', "_"));
        assert!(
            source.contains(&test) && source.contains(&format!("smoke(\"{name}\")")),
            "scenario {name} has no test of its own here (`{test}` running `smoke(\"{name}\")`)"
        );
    }
}

/// Rendered from the results a scenario left, the report replaces only that scenario's section
/// of a page written by hand (and the machine section while the page has none), and keeps
/// everything else: checked with the cost scenario's results, the cheapest to make.
fn assert_the_report_keeps_the_hand_written_text(smoke: &Smoke) {
    let (dir, results) = (&smoke.dir, &smoke.results);
    let out = dir.path().join("page.md");
    std::fs::write(
        &out,
        format!(
            "# Performance\n\nWritten by hand before.\n\n{}\nstale numbers\n{}\n\nWritten by hand after.\n",
            marker("cost", "begin"),
            marker("cost", "end")
        ),
    )
    .unwrap();
    let render = |out: &Path| {
        bench(&[
            "report",
            "--render-only",
            "--scenarios",
            "cost",
            "--results-dir",
            results.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
    };
    assert_success(&render(&out));
    let doc = std::fs::read_to_string(&out).unwrap();
    assert!(doc.contains("Written by hand before."), "{doc}");
    assert!(doc.contains("Written by hand after."), "{doc}");
    assert!(!doc.contains("stale numbers"), "{doc}");
    for name in ["machine", "cost"] {
        for which in ["begin", "end"] {
            assert_eq!(
                doc.matches(&marker(name, which)).count(),
                1,
                "{name} {which}"
            );
        }
    }
    // A report of some scenarios leaves the machine section as the last whole report wrote it:
    // it speaks for sections this report does not measure.
    let begin = marker("machine", "begin");
    let start = doc.find(&begin).unwrap() + begin.len();
    let stop = doc.find(&marker("machine", "end")).unwrap();
    let by_hand = format!(
        "{}\nthe machine of the last whole report\n{}",
        &doc[..start],
        &doc[stop..]
    );
    std::fs::write(&out, &by_hand).unwrap();
    assert_success(&render(&out));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), by_hand);
}

#[test]
fn matrix() {
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke("matrix");
    // Every backend × algorithm ran, peak and half, and decided.
    let matrix = records(&results, "matrix");
    let runs = of_kind(&matrix, "tollgate");
    for backend in ["memory", "redis", "redis-cluster"] {
        for algorithm in ["counter", "log"] {
            for mode in ["peak", "half"] {
                let run = runs
                    .iter()
                    .find(|r| {
                        r["backend"] == backend && r["algorithm"] == algorithm && r["mode"] == mode
                    })
                    .unwrap_or_else(|| panic!("no {backend} {algorithm} {mode} run"));
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
    // One row per backend and algorithm, with every number; Redis CPU only where there is one.
    let rows = table_after(
        &doc,
        "| backend | algorithm | shards | in flight | peak decisions/s",
    );
    assert_eq!(rows.len(), 6, "{rows:?}");
    for row in &rows {
        let blank: Vec<usize> = (0..row.len()).filter(|&i| row[i] == "–").collect();
        let expected: &[usize] = if row[0] == "memory" { &[7] } else { &[] };
        assert_eq!(blank, expected, "{row:?}");
    }
}

#[test]
fn hotkey() {
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke("hotkey");
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
    let hot_rows = table_after(&doc, "**One hot limit on the cluster");
    assert_eq!(hot_rows.len(), 2, "{hot_rows:?}");
    assert_eq!(hot_rows[0][5], "100%", "{hot_rows:?}");
    assert!(doc.contains("`shards: 8` over `shards: 1`"), "{doc}");
}

#[test]
fn attack() {
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke("attack");
    // attack: refusals on every backend, with tollgate's defaults (no cache flag) and with the
    // cache off; script calls counted on the Redis ones, every refusal one call without the
    // cache, never more than that with the defaults (how far below is the product's business,
    // not a smoke test's).
    let attack = records(&results, "attack");
    let attacks = of_kind(&attack, "run");
    for backend in ["memory", "redis", "redis-cluster"] {
        for cache in ["default", "off"] {
            let run = attacks
                .iter()
                .find(|r| r["backend"] == backend && r["cache"] == cache)
                .unwrap_or_else(|| panic!("no attack run on {backend}, cache {cache}"));
            assert!(number(run, &["load", "over_limit"]) > 0.0, "{run}");
            assert_eq!(run["limit"], 100);
            assert_eq!(run["script_calls"].is_null(), backend == "memory", "{run}");
        }
    }
    let attack_rows = table_after(&doc, "**One key far over its limit.**");
    assert_eq!(attack_rows.len(), 6, "{attack_rows:?}");
    for pair in attack_rows[2..].chunks(2) {
        let calls =
            |row: &Vec<String>| -> f64 { row[6].parse().unwrap_or_else(|_| panic!("{row:?}")) };
        assert_eq!(
            (pair[0][1].as_str(), pair[1][1].as_str()),
            ("default", "off"),
            "{pair:?}"
        );
        assert!(
            calls(&pair[1]) >= 0.99,
            "every refusal is a call without the cache: {pair:?}"
        );
        assert!(calls(&pair[0]) <= calls(&pair[1]) + 0.01, "{pair:?}");
    }
    for backend in ["redis", "redis-cluster"] {
        assert!(
            doc.contains(&format!("{backend} script calls per refusal "))
                && doc.contains(" with the defaults (the aim: at most 0.01), "),
            "{doc}"
        );
    }
}

#[test]
fn overload() {
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke("overload");
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
    assert_eq!(table_after(&doc, "**Twice the saturation rate.**").len(), 4);
}

#[test]
fn memory() {
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke("memory");
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
}

#[test]
fn accuracy() {
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke("accuracy");
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
}

#[test]
fn redis_cpu() {
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke("redis-cpu");
    // redis-cpu: both floors, and script time for every point.
    let redis_cpu = records(&results, "redis-cpu");
    let floors = of_kind(&redis_cpu, "floor");
    assert_eq!(floors.len(), 3, "{floors:?}");
    for floor in &floors {
        assert!(number(floor, &["usec_per_decision"]) > 0.0, "{floor}");
    }
    // 2 backends × 2 algorithms × (admitted with 1 descriptor of 1 and 2 limits and 3
    // descriptors of one, refused with 1 descriptor of 1 and 2 limits).
    let cpu_runs = of_kind(&redis_cpu, "run");
    assert_eq!(cpu_runs.len(), 20, "{cpu_runs:?}");
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
    // A descriptor's limits are one script call, whatever their number.
    for run in cpu_runs
        .iter()
        .filter(|r| r["descriptors"] == 1 && r["limits"] != 1)
    {
        let decisions = number(run, &["load", "decisions"]);
        assert_eq!(number(run, &["script_calls"]), decisions, "{run}");
    }
    // Each limit of a descriptor holds as many bytes as the first.
    let bytes = of_kind(&redis_cpu, "key-bytes");
    assert_eq!(bytes.len(), 4, "{bytes:?}");
    for algorithm in ["counter", "log"] {
        let of = |limits: u32| {
            let record = bytes
                .iter()
                .find(|b| b["algorithm"] == algorithm && b["limits"] == limits)
                .unwrap_or_else(|| panic!("no {algorithm} bytes for {limits} limits"));
            number(record, &["bytes"])
        };
        assert!(of(1) > 0.0);
        assert_eq!(of(2), 2.0 * of(1), "{bytes:?}");
    }
    assert_eq!(table_after(&doc, "### Redis CPU per decision").len(), 20);
    assert!(doc.contains("Each extra limit on one descriptor"), "{doc}");
}

#[test]
fn cost() {
    let smoke = smoke("cost");
    assert_the_report_keeps_the_hand_written_text(&smoke);
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke;
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
        table_after(&doc, "**The cost of the per-limit statistics.**").len(),
        2
    );
    assert!(
        doc.contains(
            "Throughput with the statistics over without, the median of the runs' ratios: "
        ),
        "{doc}"
    );
}

#[test]
fn lease() {
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke("lease");
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
        table_after(&doc, "**One hot limit shared by 3 instances").len(),
        10
    );
    assert_eq!(table_after(&doc, "**Twice the limit").len(), 8);
}

#[test]
fn burst() {
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke("burst");
    // burst: three instances share each leased limit and take three times it; every call is
    // answered (a failed store call is a refusal with `--failure-mode deny`), something is
    // admitted, and no burst that fits in its window admits more than the limit: the log not
    // one hit more, the counter no more than the share of a window the burst took past the
    // start of a fixed window, since its estimate weighs the window before by what is left.
    let burst = records(&results, "burst");
    let runs = of_kind(&burst, "run");
    assert_eq!(runs.len(), 8, "{runs:?}");
    for algorithm in ["counter", "log"] {
        for window in ["long", "short"] {
            for backend in ["redis", "redis-cluster"] {
                let run = runs
                    .iter()
                    .find(|r| {
                        r["algorithm"] == algorithm
                            && r["window"] == window
                            && r["backend"] == backend
                    })
                    .unwrap_or_else(|| panic!("no burst run of {algorithm} {window} {backend}"));
                assert_eq!(run["instances"], 3, "{run}");
                let limit = number(run, &["limit"]);
                let sent = number(run, &["sent"]);
                assert_eq!(sent, 3.0 * limit, "{run}");
                let load = &run["load"];
                assert_eq!(
                    number(load, &["decisions"]) + number(load, &["errors"]),
                    sent,
                    "{run}"
                );
                let ok = number(load, &["ok"]);
                assert!(ok > 0.0, "{run}");
                assert!(number(run, &["script_calls"]) > 0.0, "{run}");
                let window_seconds = number(run, &["window_seconds"]);
                let elapsed = number(load, &["elapsed_seconds"]);
                if elapsed <= window_seconds {
                    let slack = if algorithm == "counter" {
                        (limit * elapsed / window_seconds).ceil()
                    } else {
                        0.0
                    };
                    assert!(ok <= limit + slack, "over the limit in one window: {run}");
                }
            }
        }
    }
    let rows = table_after(
        &doc,
        "**A burst at 3× a leased limit shared by 3 instances.**",
    );
    assert_eq!(rows.len(), 8, "{rows:?}");
    for row in &rows {
        assert_eq!(row.len(), 12, "{row:?}");
        let used: f64 = row[7]
            .trim_end_matches('%')
            .parse()
            .unwrap_or_else(|_| panic!("{row:?}"));
        assert!(used > 0.0, "{row:?}");
    }
    assert!(doc.contains("\nOf the 8 rows, same run: "), "{doc}");
}

#[test]
fn keys() {
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke("keys");
    // keys: both windows measured; the per-client log stored keys while its clients sent, and
    // after the last hit the count only falls (nothing writes any more), down to none when the
    // run says the keys were gone.
    let keys = records(&results, "keys");
    let runs = of_kind(&keys, "run");
    assert_eq!(runs.len(), 2, "{runs:?}");
    for window in [1.0, 4.0] {
        let run = runs
            .iter()
            .find(|r| number(r, &["window_seconds"]) == window)
            .unwrap_or_else(|| panic!("no keys run of a {window} s window"));
        assert_eq!(run["clients"], 2000, "{run}");
        assert!(number(run, &["load", "ok"]) > 0.0, "{run}");
        let count = |sample: &Value| number(sample, &["keys"]);
        let during = run["during"].as_array().unwrap();
        assert!(during.iter().map(count).fold(0.0, f64::max) > 0.0, "{run}");
        let after: Vec<f64> = run["after"].as_array().unwrap().iter().map(count).collect();
        assert!(!after.is_empty(), "{run}");
        assert!(after.windows(2).all(|w| w[1] <= w[0]), "{run}");
        match run["gone_after_seconds"].as_f64() {
            Some(seconds) => {
                assert_eq!(after.last(), Some(&0.0), "{run}");
                assert!(seconds <= number(run, &["wait_seconds"]) + 1.0, "{run}");
            }
            None => assert!(after.iter().all(|&keys| keys > 0.0), "{run}"),
        }
    }
    let rows = table_after(&doc, "**Keys a per-client log limit keeps in Redis.**");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        (rows[0][8].as_str(), rows[1][8].as_str()),
        ("4.0", "13.0"),
        "{rows:?}"
    );
    assert!(
        doc.contains(
            "\nSeconds from the last hit until every key was gone, same run: `window: 1s` "
        ),
        "{doc}"
    );
}

#[test]
fn grpc_floor() {
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke("grpc-floor");
    // grpc-floor: tollgate and the stock tonic server both answered closed loop, and the
    // ratio of their rates is written.
    let floor = records(&results, "grpc-floor");
    let floor_runs = of_kind(&floor, "run");
    assert_eq!(floor_runs.len(), 2, "{floor_runs:?}");
    for server in ["tollgate", "empty"] {
        let run = floor_runs
            .iter()
            .find(|r| r["server"] == server)
            .unwrap_or_else(|| panic!("no grpc-floor run of {server}"));
        assert!(number(run, &["load", "ok"]) > 0.0, "{run}");
        assert!(number(run, &["cpu_seconds"]) >= 0.0, "{run}");
    }
    assert_eq!(
        table_after(&doc, "### tollgate against a stock tonic server").len(),
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
}

#[test]
fn limitador() {
    // Without a limitador-server (these runs never have one), the scenario is skipped by name,
    // says how to get one, and leaves neither results nor a section.
    let smoke = smoke("limitador");
    assert!(
        smoke
            .stderr
            .contains("skipping limitador, its section stays as it was: no limitador-server")
            && smoke
                .stderr
                .contains("cargo build --release -p limitador-server"),
        "{}",
        smoke.stderr
    );
    let empty = format!(
        "{}\n{}",
        marker("limitador", "begin"),
        marker("limitador", "end")
    );
    assert!(smoke.doc.contains(&empty), "{}", smoke.doc);
    assert!(!smoke.results.join("limitador.jsonl").exists());
}

#[test]
fn envoy() {
    let Smoke {
        dir: _dir,
        results,
        doc,
        ..
    } = smoke("envoy");
    // envoy: every setup answered every request, saturated and paced; RLS called tollgate
    // about once per request and Redis once per decision, RLQS far less than once.
    let runs = records(&results, "envoy");
    let runs = of_kind(&runs, "run");
    assert_eq!(runs.len(), 10, "{runs:?}");
    let per_request = |setup: &str, path: &[&str]| {
        let run = runs
            .iter()
            .find(|r| r["setup"] == setup && r["pace"] == "saturated")
            .unwrap_or_else(|| panic!("no saturated envoy run of {setup}: {runs:?}"));
        assert!(number(run, &["load", "succeeded"]) > 0.0, "{run}");
        // Only an RLQS Envoy may refuse, when a renewal came late on a loaded machine.
        if !setup.starts_with("rlqs") {
            assert_eq!(number(run, &["load", "failed"]), 0.0, "{run}");
        }
        number(run, path) / number(run, &["load", "succeeded"])
    };
    // Envoy alone calls nothing; what tollgate counts meanwhile is the RLQS Envoys' streams,
    // renewed in the background whatever load the run sends, a few messages a second.
    let alone = per_request("no-filter", &["cost", "tollgate_calls"]);
    assert!(
        alone < 0.1,
        "calls to tollgate per request of Envoy alone: {alone}"
    );
    // Per request answered: the calls of the requests still in flight when h2load stopped
    // count too, which a smoke run's few requests make visible.
    let rls = per_request("rls", &["cost", "tollgate_calls"]);
    assert!((0.9..=2.0).contains(&rls), "RLS calls per request: {rls}");
    let rls_redis = per_request("rls", &["cost", "redis_calls"]);
    assert!(
        (0.9..=2.0).contains(&rls_redis),
        "RLS Redis calls: {rls_redis}"
    );
    let rlqs = per_request("rlqs", &["cost", "tollgate_calls"]);
    assert!(rlqs < 0.5, "RLQS messages per request: {rlqs}");
    for pace in ["saturated", "paced"] {
        assert_eq!(
            runs.iter().filter(|r| r["pace"] == pace).count(),
            5,
            "{runs:?}"
        );
    }
    assert_eq!(
        table_after(&doc, "### Envoy with RLS and with RLQS").len(),
        5
    );
    assert!(
        doc.contains(
            "Requests a second through Envoy, RLQS ÷ RLS, the median of the runs' ratios: "
        ),
        "{doc}"
    );
    assert_eq!(table_after(&doc, "\nPaced, the mean latency").len(), 5);
    assert_eq!(table_after(&doc, "\n**Sizing**").len(), 3);
}

#[test]
fn instructions() {
    let smoke = smoke("instructions");
    let (results, doc) = (smoke.results.as_path(), smoke.doc.as_str());
    // instructions: callgrind counted every server over the calls h2load sent it, and tollgate
    // on Redis executes more a call than on the memory backend (the Redis client's work).
    // Without valgrind, the scenario is skipped by name and says why.
    if !callgrind_installed() {
        assert!(
            smoke
                .stderr
                .contains("skipping instructions, its section stays as it was: "),
            "{}",
            smoke.stderr
        );
        return;
    }
    let counted = records(results, "instructions");
    let runs = of_kind(&counted, "run");
    let per_call = |server: &str| {
        let run = runs
            .iter()
            .find(|r| r["server"] == server)
            .unwrap_or_else(|| panic!("no instructions run of {server}"));
        assert!(number(run, &["calls"]) >= 100.0, "{run}");
        number(run, &["instructions"]) / number(run, &["calls"])
    };
    for server in [
        "empty",
        "tollgate",
        "tollgate-no-local-cache",
        "tollgate-no-stats",
    ] {
        assert!(per_call(server) > 0.0, "{server}");
    }
    assert!(per_call("tollgate-redis") > per_call("tollgate"));
    assert_eq!(
        table_after(doc, "### Instructions per call, counted").len(),
        5
    );
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
