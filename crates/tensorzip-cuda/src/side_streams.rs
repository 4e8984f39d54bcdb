//! Streams of the engine's own beside a call's stream, for work of one call that may overlap (the
//! encoder's compaction of one wave of chunks under the encoding of the next).
//!
//! Each stream starts after everything queued on the call's stream so far and, when the set is
//! joined or dropped, everything queued on it comes before what the call's stream queues next: the
//! call's buffers (freed in stream order on the call's stream) outlive the side work, and the
//! call's final synchronisation waits for it. The streams are created raw and used through
//! borrowed wrappers (`CudaContext::wrap_borrowed_stream`) rather than `CudaContext::new_stream`:
//! cudarc switches a context with streams of its own to event tracking on every buffer (an event
//! recorded per use, from then on, for the whole process), which the engine does not need — its
//! calls order their streams by the events below.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};

use crate::error::Result;

/// Non-blocking streams forked from `parent`, joined back into it by [`SideStreams::join`] or on
/// drop.
pub(crate) struct SideStreams {
    parent: Arc<CudaStream>,
    streams: Vec<Arc<CudaStream>>,
    /// The raw handles, destroyed on drop (the wrappers do not own them).
    raw: Vec<sys::CUstream>,
}

impl SideStreams {
    /// `n` streams of the default priority, each waiting for the work queued on `parent` so far.
    /// (The compactions' stream at the device's greatest priority was measured and was no
    /// better: docs/GPU.md, "Encoder", step 4.)
    pub(crate) fn fork(ctx: &Arc<CudaContext>, parent: &Arc<CudaStream>, n: usize) -> Result<Self> {
        let mut set = SideStreams {
            parent: parent.clone(),
            streams: Vec::with_capacity(n),
            raw: Vec::with_capacity(n),
        };
        ctx.bind_to_thread()?;
        let start = parent.record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        for _ in 0..n {
            let raw = result::stream::create(result::stream::StreamKind::NonBlocking)?;
            set.raw.push(raw);
            // SAFETY: `raw` is a stream of this context (created above, the context bound), and
            // it stays alive as long as the wrapper: both live in `set`, and the wrapper is never
            // handed out beyond a borrow of `set` (`get`); the stream is destroyed in `drop`
            // after the wrappers. Work on it is ordered with the parent's by the events here.
            let s = unsafe { ctx.wrap_borrowed_stream(raw) };
            s.wait(&start)?;
            set.streams.push(s);
        }
        Ok(set)
    }

    /// Side stream `k`.
    pub(crate) fn get(&self, k: usize) -> &Arc<CudaStream> {
        &self.streams[k % self.streams.len()]
    }

    /// Makes the parent stream wait for everything queued on the side streams so far.
    pub(crate) fn join(&self) -> Result<()> {
        for s in &self.streams {
            let done: CudaEvent =
                s.record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
            self.parent.wait(&done)?;
        }
        Ok(())
    }
}

impl Drop for SideStreams {
    fn drop(&mut self) {
        // On every way out (an error included), the parent's next work — freeing the call's
        // buffers, its final synchronisation — comes after the side work. Where even that fails,
        // the device itself is failing; the parent is synchronised as a last resort.
        if self.join().is_err() {
            let _ = self.parent.synchronize();
            for s in &self.streams {
                let _ = s.synchronize();
            }
        }
        self.streams.clear();
        for raw in self.raw.drain(..) {
            // SAFETY: a stream created in `fork`, whose wrappers are gone; CUDA releases it once
            // the work queued on it has completed.
            let _ = unsafe { result::stream::destroy(raw) };
        }
    }
}
