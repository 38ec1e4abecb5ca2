//! The message of a panic, kept for the communicator that is dropped while
//! it unwinds: peers then hear why this rank failed, not just that it did.

use std::cell::RefCell;
use std::sync::Once;

thread_local! {
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Chain a hook before the program's own that notes each panic's message
/// and place (once per process; the previous hook still runs).
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let what = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text panic".to_owned());
            let place = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            LAST.with(|l| *l.borrow_mut() = Some(format!("{what}{place}")));
            previous(info);
        }));
    });
}

/// The message of the panic this thread is unwinding from, if noted.
pub(crate) fn last() -> Option<String> {
    LAST.with(|l| l.borrow().clone())
}
