//! Reading the replies of the operator's scripts (`lua/peek.lua`, `lua/clear.lua`).

use redis::Value;

use crate::backend::{BackendError, Hit, WindowState};
use crate::window::Algorithm;

/// The state of `hit`'s window from `lua/peek.lua`'s reply `{now, a, b}`.
pub(super) fn window_state(hit: &Hit, reply: Value) -> Result<WindowState, BackendError> {
    let unexpected = |reply: &Value| {
        BackendError::Protocol(format!(
            "a peek call replied {reply:?} instead of three integers"
        ))
    };
    let numbers: Option<Vec<u64>> = match &reply {
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::Int(n) => u64::try_from(*n).ok(),
                _ => None,
            })
            .collect(),
        _ => None,
    };
    let Some([now, a, b]) = numbers.and_then(|n| <[u64; 3]>::try_from(n).ok()) else {
        return Err(unexpected(&reply));
    };
    Ok(match hit.algorithm {
        Algorithm::SlidingWindowCounter => {
            WindowState::counter(hit.limit, hit.window_ms, now, a, b)
        }
        Algorithm::SlidingWindowLog => WindowState::log_sum(
            hit.limit,
            hit.window_ms,
            now,
            u128::from(a),
            (a > 0).then_some(b),
        ),
    })
}

/// `lua/clear.lua`'s reply: how many of the window's keys existed.
pub(super) fn cleared(_hit: &Hit, reply: Value) -> Result<(), BackendError> {
    match reply {
        Value::Int(_) => Ok(()),
        other => Err(BackendError::Protocol(format!(
            "a clear call replied {other:?} instead of a key count"
        ))),
    }
}
