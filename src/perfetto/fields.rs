//! The fields of spans and events as `TrackEvent.debug_annotations`, and the
//! launch id that marks a launch span ([`LAUNCH_ID_FIELD`]).

use std::cell::RefCell;
use std::fmt::Write as _;

use tracing::field::{Field, Visit};

use super::host::annotation;
use super::proto::{field, Enc};

/// The field that marks a launch span: its value is the launch id, and the
/// span's first slice starts a flow arrow to that launch's kernel slice.
const LAUNCH_ID_FIELD: &str = "gpu.launch_id";

thread_local! {
    static SCRATCH: RefCell<Fields> = RefCell::new(Fields::default());
}

/// Fields of a span or event, encoded as `TrackEvent.debug_annotations`.
#[derive(Debug, Default)]
pub(crate) struct Fields {
    pub(crate) args: Enc,
    /// An event's `message` (its name in the trace).
    pub(crate) message: String,
    /// The value of [`LAUNCH_ID_FIELD`], if present.
    pub(crate) launch: Option<u64>,
    /// Whether `message` becomes the name (events) or an argument (spans).
    message_is_name: bool,
}

impl Fields {
    fn clear(&mut self, message_is_name: bool) {
        self.args.clear();
        self.message.clear();
        self.launch = None;
        self.message_is_name = message_is_name;
    }

    fn annotation(&mut self, name: &str, value: impl FnOnce(&mut Enc)) {
        annotation(&mut self.args, name, value);
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, f: &Field, value: &dyn std::fmt::Debug) {
        if f.name() == "message" && self.message_is_name {
            let _ = write!(self.message, "{value:?}");
            return;
        }
        let mut s = std::mem::take(&mut self.message);
        let at = s.len();
        let _ = write!(s, "{value:?}");
        self.annotation(f.name(), |e| {
            e.bytes(field::ANNOTATION_STRING, &s.as_bytes()[at..])
        });
        s.truncate(at);
        self.message = s;
    }
    fn record_str(&mut self, f: &Field, value: &str) {
        if f.name() == "message" && self.message_is_name {
            self.message.push_str(value);
            return;
        }
        self.annotation(f.name(), |e| {
            e.bytes(field::ANNOTATION_STRING, value.as_bytes())
        });
    }
    fn record_u64(&mut self, f: &Field, value: u64) {
        if f.name() == LAUNCH_ID_FIELD {
            self.launch = Some(value);
        }
        self.annotation(f.name(), |e| e.uint(field::ANNOTATION_UINT, value));
    }
    fn record_i64(&mut self, f: &Field, value: i64) {
        if f.name() == LAUNCH_ID_FIELD && value >= 0 {
            self.launch = Some(value as u64);
        }
        self.annotation(f.name(), |e| e.int(field::ANNOTATION_INT, value));
    }
    fn record_bool(&mut self, f: &Field, value: bool) {
        self.annotation(f.name(), |e| {
            e.uint(field::ANNOTATION_BOOL, u64::from(value))
        });
    }
    fn record_f64(&mut self, f: &Field, value: f64) {
        self.annotation(f.name(), |e| e.double(field::ANNOTATION_DOUBLE, value));
    }
}

/// What a span keeps between its creation and its enters: its encoded
/// fields, and the launch whose flow its first slice starts.
#[derive(Debug, Default)]
pub(crate) struct SpanArgs {
    /// Inline up to 64 bytes (on the heap beyond): a launch span's two fields
    /// take 38 at most, so it allocates nothing of its own here.
    pub(crate) args: smallvec::SmallVec<[u8; 64]>,
    pub(crate) launch: Option<u64>,
}

/// Visits `record` with the thread's scratch fields (or fresh ones if a
/// field's `Debug` re-entered tracing).
pub(crate) fn with_fields<R>(message_is_name: bool, f: impl FnOnce(&mut Fields) -> R) -> R {
    let mut f = Some(f);
    let r = SCRATCH
        .try_with(|s| {
            let mut s = s.try_borrow_mut().ok()?;
            s.clear(message_is_name);
            f.take().map(|f| f(&mut s))
        })
        .ok()
        .flatten();
    match (r, f) {
        (Some(r), _) => r,
        (None, Some(f)) => {
            let mut fresh = Fields::default();
            fresh.clear(message_is_name);
            f(&mut fresh)
        }
        (None, None) => unreachable!("the closure ran and returned"),
    }
}
