//! The sketch's promises, checked against exact counts of known and random streams: counts
//! never below the truth, never above it by more than `N / k`, every item heavier than `N / k`
//! listed; and the same after merging slots.

use std::collections::HashMap;

use super::*;

/// Offers `stream` to a summary of `capacity` and checks the bounds against the exact counts.
fn check_bounds(stream: &[u64], capacity: usize) -> SpaceSaving<u64> {
    let mut sketch = SpaceSaving::new(capacity);
    let mut exact: HashMap<u64, u64> = HashMap::new();
    for &item in stream {
        sketch.offer(item, 1, || item);
        *exact.entry(item).or_default() += 1;
    }
    let n = stream.len() as u64;
    let bound = n / capacity as u64;
    assert_eq!(sketch.total(), n);
    assert!(
        sketch.floor() <= bound,
        "floor {} > N/k {bound}",
        sketch.floor()
    );
    for item in sketch.items() {
        let truth = exact[&item.value];
        assert!(
            item.count >= truth,
            "{}: {} < {truth}",
            item.value,
            item.count
        );
        assert!(
            item.count - truth <= item.error && item.error <= bound,
            "{}: {} over {truth} by more than {bound}",
            item.value,
            item.count
        );
    }
    for (item, truth) in &exact {
        if *truth > bound {
            assert!(
                sketch.get(*item).is_some(),
                "{item} ({truth} > {bound}) missing"
            );
        }
    }
    sketch
}

#[test]
fn a_small_stream_is_counted_exactly() {
    let sketch = check_bounds(&[1, 2, 1, 3, 1, 2], 4);
    assert_eq!(sketch.get(1).map(|c| c.count), Some(3));
    assert_eq!(sketch.get(2).map(|c| c.count), Some(2));
    assert_eq!(sketch.floor(), 0);
}

#[test]
fn heavy_items_survive_a_flood_of_distinct_ones() {
    // Two heavy hitters among 10,000 one-off items, with 8 counters.
    let mut stream = Vec::new();
    for i in 0..10_000u64 {
        stream.push(1_000_000 + i);
        if i % 4 == 0 {
            stream.push(1);
        }
        if i % 5 == 0 {
            stream.push(2);
        }
    }
    let sketch = check_bounds(&stream, 8);
    let mut top: Vec<_> = sketch.items().iter().collect();
    top.sort_by_key(|item| std::cmp::Reverse(item.count));
    assert_eq!(top[0].value, 1);
    assert_eq!(top[1].value, 2);
}

#[test]
fn random_skewed_streams_keep_the_bound() {
    let mut rng = fastrand::Rng::with_seed(56);
    for capacity in [1, 4, 16, 64] {
        for _ in 0..20 {
            // A Zipf-like stream: item i is about twice as likely as item i+1.
            let stream: Vec<u64> = (0..3_000)
                .map(|_| u64::from(rng.u32(..).leading_zeros()) * 1000 + rng.u64(..3))
                .collect();
            check_bounds(&stream, capacity);
        }
    }
}

#[test]
fn weights_count_as_that_many_offers() {
    let mut sketch = SpaceSaving::new(2);
    sketch.offer(7, 5, || 7);
    sketch.offer(8, 1, || 8);
    sketch.offer(9, 2, || 9); // takes over 8's counter: 1 + 2, error 1
    let nine = sketch.get(9).cloned();
    assert_eq!(nine.map(|c| (c.count, c.error)), Some((3, 1)));
    assert!(sketch.get(8).is_none());
    assert_eq!(sketch.total(), 8);
}

#[test]
fn merged_slots_keep_the_bound_over_their_total() {
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..20 {
        let mut exact: HashMap<u64, u64> = HashMap::new();
        let parts: Vec<SpaceSaving<u64>> = (0..SLOTS)
            .map(|_| {
                let mut sketch = SpaceSaving::new(8);
                for _ in 0..rng.usize(0..500) {
                    let item = u64::from(rng.u32(..).leading_zeros()) * 10 + rng.u64(..4);
                    sketch.offer(item, 1, || item);
                    *exact.entry(item).or_default() += 1;
                }
                sketch
            })
            .collect();
        let n: u64 = parts.iter().map(SpaceSaving::total).sum();
        let bound = n / 8;
        let merged = merge(&parts);
        for (item, count) in &merged {
            let truth = exact[item];
            assert!(
                *count >= truth && *count - truth <= bound,
                "{item}: {count} vs {truth}"
            );
        }
        for (item, truth) in &exact {
            if *truth > bound {
                assert!(merged.iter().any(|(m, _)| m == item), "{item} missing");
            }
        }
        assert!(merged.windows(2).all(|w| w[0].1 >= w[1].1));
    }
}

fn refuse(top: &TopRefused, user: &str, times: u64, now_ms: u64) {
    for _ in 0..times {
        top.record("edge", [("user", user)], ("per_user", false), 1, now_ms);
    }
}

#[test]
fn the_top_lists_the_last_five_minutes_most_refused_first() {
    let top = TopRefused::default();
    let t0 = 1_000 * SLOT_MS;
    refuse(&top, "old", 50, t0 - 5 * SLOT_MS); // six minutes before the query: gone
    refuse(&top, "alice", 3, t0 - 4 * SLOT_MS);
    refuse(&top, "alice", 4, t0);
    refuse(&top, "bob", 5, t0 - SLOT_MS);
    let listed = top.top("edge", 10, t0 + 1);
    let names: Vec<(String, u64)> = listed
        .iter()
        .map(|(r, c)| (r.entries[0].1.clone(), *c))
        .collect();
    assert_eq!(names, vec![("alice".into(), 7), ("bob".into(), 5)]);
    assert_eq!(listed[0].0.limit, "per_user");
    assert_eq!(top.top("edge", 1, t0).len(), 1);
    assert!(top.top("other", 10, t0).is_empty());
}

#[test]
fn a_slot_is_emptied_when_its_minute_comes_round_again() {
    let top = TopRefused::default();
    refuse(&top, "alice", 3, 0);
    refuse(&top, "bob", 1, SLOTS as u64 * SLOT_MS);
    let listed = top.top("edge", 10, SLOTS as u64 * SLOT_MS);
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].0.entries,
        vec![("user".to_string(), "bob".to_string())]
    );
}

#[test]
fn long_text_is_cut_and_domains_are_bounded() {
    let top = TopRefused::default();
    let long = "é".repeat(MAX_TEXT);
    top.record("edge", [("user", long.as_str())], ("l", false), 1, 0);
    let listed = top.top("edge", 1, 0);
    assert!(listed[0].0.entries[0].1.len() <= MAX_TEXT);
    for i in 0..MAX_DOMAINS + 10 {
        top.record(&format!("d{i}"), [("k", "v")], ("l", false), 1, 0);
    }
    assert_eq!(top.domains().len(), MAX_DOMAINS);
}
