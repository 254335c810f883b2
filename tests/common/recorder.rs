//! A local metrics recorder for one outbox: install it around `build`
//! (the outbox registers its handles then), read the series later.

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// The recorder of one test's outbox.
pub struct Recorder {
    recorder: DebuggingRecorder,
    snapshotter: Snapshotter,
}

impl Recorder {
    pub fn new() -> Recorder {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        Recorder {
            recorder,
            snapshotter,
        }
    }

    /// Runs `f` (which builds the outbox) with this recorder in force.
    pub fn install<T>(&self, f: impl FnOnce() -> T) -> T {
        ::metrics::with_local_recorder(&self.recorder, f)
    }

    fn find(&self, name: &str, outbox: &str, reason: Option<&str>) -> Option<DebugValue> {
        self.snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find(|(key, _, _, _)| {
                let key = key.key();
                let label = |l: &str| {
                    key.labels()
                        .find(|x| x.key() == l)
                        .map(|x| x.value().to_owned())
                };
                key.name() == name
                    && label("outbox").as_deref() == Some(outbox)
                    && label("reason").as_deref() == reason
            })
            .map(|(_, _, _, value)| value)
    }

    /// The counter `name{outbox, reason}`; panics when it is missing.
    pub fn counter(&self, name: &str, outbox: &str, reason: Option<&str>) -> u64 {
        match self.find(name, outbox, reason) {
            Some(DebugValue::Counter(v)) => v,
            other => panic!("{name}{{outbox={outbox}, reason={reason:?}}}: {other:?}"),
        }
    }

    /// The gauge `name{outbox}`; panics when it is missing.
    pub fn gauge(&self, name: &str, outbox: &str) -> f64 {
        match self.find(name, outbox, None) {
            Some(DebugValue::Gauge(v)) => v.into_inner(),
            other => panic!("{name}{{outbox={outbox}}}: {other:?}"),
        }
    }
}
