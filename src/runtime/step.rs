//! The error of the helper processes (init, pause, monitor): the step that failed and why. The
//! helpers report it to the daemon as one line of text over a pipe, so it keeps the cause's
//! message rather than the cause itself.

use std::fmt::Display;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{step}: {detail}")]
pub struct StepError {
    pub step: String,
    pub detail: String,
}

impl StepError {
    pub fn new(step: impl Into<String>, detail: impl Display) -> StepError {
        StepError {
            step: step.into(),
            detail: detail.to_string(),
        }
    }
}

impl StepError {
    /// A helper's report read back (`step: detail`, as the error shows itself).
    pub fn parse(report: &str) -> StepError {
        match report.split_once(": ") {
            Some((step, detail)) => StepError::new(step, detail),
            None => StepError::new("helper", report),
        }
    }
}

/// For `map_err`: the failure of `step`, with the cause's message.
pub fn step<E: Display>(step: impl Into<String>) -> impl FnOnce(E) -> StepError {
    let step = step.into();
    move |e| StepError {
        step,
        detail: e.to_string(),
    }
}
