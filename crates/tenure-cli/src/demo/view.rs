//! The live view: where the demo's progress goes and how it is drawn.

use super::*;

/// Where the demo's progress goes.
pub enum Display {
    /// Redraw a live view with ANSI escapes (a terminal).
    Live(Box<dyn Write + Send>),
    /// One plain line per step.
    Lines(Box<dyn Write + Send>),
}

pub(super) struct View {
    pub(super) display: Mutex<Display>,
    pub(super) drawn: Mutex<usize>,
}

impl View {
    pub(super) fn line(&self, text: &str) {
        let mut d = match self.display.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Display::Lines(w) = &mut *d {
            let _ = writeln!(w, "{text}");
            let _ = w.flush();
        }
    }

    pub(super) fn is_live(&self) -> bool {
        matches!(
            *match self.display.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            },
            Display::Live(_)
        )
    }

    pub(super) fn draw(&self, frame: &str) {
        let mut d = match self.display.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let mut drawn = match self.drawn.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Display::Live(w) = &mut *d {
            let mut out = String::new();
            if *drawn > 0 {
                // Back to the first line of the last frame, clear to the end.
                let _ = write!(out, "\x1b[{}F\x1b[J", *drawn);
            }
            out.push_str(frame);
            let _ = w.write_all(out.as_bytes());
            let _ = w.flush();
            *drawn = frame.lines().count();
        }
    }
}
