//! A progress bar on a terminal for the commands whose simulations and
//! searches can take seconds (`sim`, `topo`, `synth`); nothing at all when
//! stderr is not a terminal, so piped output and logs stay clean. It
//! draws on stderr and clears itself before the command prints its table.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A bar (or spinner) that clears itself when dropped.
pub(crate) struct Busy(Option<ProgressBar>);

impl Busy {
    /// A bar over `len` steps of `what` (`sizes`, `candidates`).
    pub(crate) fn steps(len: usize, what: &str) -> Busy {
        Busy(terminal().then(|| {
            let bar = ProgressBar::new(len as u64);
            let template = format!("{{spinner}} {{bar:40}} {{pos}}/{{len}} {what} {{msg}}");
            if let Ok(style) = ProgressStyle::with_template(&template) {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        }))
    }

    /// A spinner saying what runs.
    pub(crate) fn spinner(what: &str) -> Busy {
        Busy(terminal().then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_message(what.to_owned());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        }))
    }

    /// Say what runs now.
    pub(crate) fn say(&self, msg: impl Into<String>) {
        if let Some(bar) = &self.0 {
            bar.set_message(msg.into());
        }
    }

    /// Print (or run anything that prints) without the bar in the way.
    pub(crate) fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.0 {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    /// One step done.
    pub(crate) fn step(&self) {
        if let Some(bar) = &self.0 {
            bar.inc(1);
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

fn terminal() -> bool {
    std::io::stderr().is_terminal()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under `cargo test` stderr is captured, not a terminal: the bar
    /// must stay away, and its calls must be harmless.
    #[test]
    fn off_a_terminal_nothing_is_drawn() {
        let b = Busy::steps(3, "sizes");
        assert!(b.0.is_none() || std::io::stderr().is_terminal());
        b.say("1 MiB");
        b.step();
        drop(b);
        let s = Busy::spinner("simulating");
        s.say("x");
    }
}
