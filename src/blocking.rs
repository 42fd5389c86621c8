//! The blocking pool (the Sun Java System Web Proxy Server 4's NativePool): a bounded set
//! of OS threads
//! for work that blocks (disk cache file I/O), so it never runs on the
//! async workers.
//!
//! Threads are started on demand up to `server.blocking_threads` and leave
//! after 30 s without work. A job that finds no free thread waits in the
//! work queue. The queue limit (`server.blocking_queue`) applies to work
//! that starts a request's use of the disk (`try_run`): when that many jobs
//! already wait, the job is refused and the request gets a busy 503, like
//! the Sun proxy's busy function. Work of a request already using the disk (the
//! next chunk of a body being sent, a store in progress) is never refused
//! (`run`), so a response is never cut off midway; it may take the queue
//! past its limit for a moment.
//!
//! Why our own pool rather than tokio's `spawn_blocking`: tokio's pool has
//! an unbounded queue and does not say how many threads are idle or how
//! many jobs wait, which are exactly the numbers the Sun proxy's tuning needs.

use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// A thread with no work for this long exits.
const IDLE_EXIT: Duration = Duration::from_secs(30);

type Job = Box<dyn FnOnce() + Send>;

/// Why a job did not run to completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolError {
    /// The work queue is full (only from `try_run`).
    Busy,
    /// The job panicked, or no thread could be started for it.
    Failed,
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PoolError::Busy => "the blocking pool's work queue is full",
            PoolError::Failed => "a blocking-pool job failed (panic or no thread)",
        })
    }
}

impl std::error::Error for PoolError {}

/// A handle to the pool; cheap to clone.
#[derive(Clone, Debug)]
pub struct BlockingPool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    work: Condvar,
    max_threads: usize,
    queue_limit: usize,
    // Mirrors of the state for lock-free snapshots.
    threads: AtomicUsize,
    idle: AtomicUsize,
    peak_threads: AtomicUsize,
    queued: AtomicUsize,
    queue_peak: AtomicUsize,
    jobs: AtomicU64,
    refused: AtomicU64,
}

struct State {
    queue: VecDeque<Job>,
    threads: usize,
    /// Threads blocked waiting for work.
    idle: usize,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("queue", &self.queue.len())
            .field("threads", &self.threads)
            .field("idle", &self.idle)
            .finish()
    }
}

impl State {
    /// Jobs that no idle thread is about to take.
    fn waiting(&self) -> usize {
        self.queue.len().saturating_sub(self.idle)
    }
}

impl BlockingPool {
    /// At most `max_threads` threads (at least 1) and `queue_limit` waiting jobs (at least 1).
    pub fn new(max_threads: usize, queue_limit: usize) -> BlockingPool {
        BlockingPool {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    threads: 0,
                    idle: 0,
                }),
                work: Condvar::new(),
                max_threads: max_threads.max(1),
                queue_limit: queue_limit.max(1),
                threads: AtomicUsize::new(0),
                idle: AtomicUsize::new(0),
                peak_threads: AtomicUsize::new(0),
                queued: AtomicUsize::new(0),
                queue_peak: AtomicUsize::new(0),
                jobs: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// A process-wide pool for library users that were given none (tests,
    /// tools): 64 threads, a queue that in practice never refuses.
    pub fn shared_default() -> BlockingPool {
        static POOL: OnceLock<BlockingPool> = OnceLock::new();
        POOL.get_or_init(|| BlockingPool::new(64, 1 << 20)).clone()
    }

    /// Runs `f` on a pool thread, waiting for one however long the queue.
    pub async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, PoolError> {
        self.execute(f, false).await
    }

    /// Runs `f` on a pool thread, or refuses with `Busy` at once if the
    /// work queue is full.
    pub async fn try_run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, PoolError> {
        self.execute(f, true).await
    }

    async fn execute<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
        refuse_when_full: bool,
    ) -> Result<T, PoolError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            // A panicking job must not take its thread (or the lock) down.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(result);
        });
        self.inner.submit(job, refuse_when_full)?;
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            _ => Err(PoolError::Failed),
        }
    }

    /// The counters now.
    pub fn snapshot(&self) -> NativePool {
        let i = &self.inner;
        NativePool {
            idle_threads: i.idle.load(Relaxed),
            threads: i.threads.load(Relaxed),
            peak_threads: i.peak_threads.load(Relaxed),
            max_threads: i.max_threads,
            queue_length: i.queued.load(Relaxed),
            queue_peak: i.queue_peak.load(Relaxed),
            queue_limit: i.queue_limit,
            jobs: i.jobs.load(Relaxed),
            refused: i.refused.load(Relaxed),
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, st: &State) {
        self.threads.store(st.threads, Relaxed);
        self.idle.store(st.idle, Relaxed);
        self.queued.store(st.waiting(), Relaxed);
    }

    fn submit(self: &Arc<Self>, job: Job, refuse_when_full: bool) -> Result<(), PoolError> {
        let mut st = self.lock();
        if st.idle > st.queue.len() {
            // An idle thread takes it at once.
            st.queue.push_back(job);
            self.publish(&st);
            drop(st);
            self.work.notify_one();
        } else if st.threads < self.max_threads {
            st.threads += 1;
            self.peak_threads.fetch_max(st.threads, Relaxed);
            self.publish(&st);
            drop(st);
            let inner = self.clone();
            let spawned = std::thread::Builder::new()
                .name("portico-blocking".into())
                .spawn(move || inner.worker(job));
            if let Err(e) = spawned {
                tracing::error!(
                    "cannot start a blocking-pool thread: {cause}",
                    cause = crate::util::io_cause(&e)
                );
                let mut st = self.lock();
                st.threads -= 1;
                self.publish(&st);
                return Err(PoolError::Failed);
            }
        } else {
            let waiting = st.waiting() + 1;
            if refuse_when_full && waiting > self.queue_limit {
                self.refused.fetch_add(1, Relaxed);
                return Err(PoolError::Busy);
            }
            st.queue.push_back(job);
            self.queue_peak.fetch_max(waiting, Relaxed);
            self.publish(&st);
        }
        self.jobs.fetch_add(1, Relaxed);
        Ok(())
    }

    fn worker(self: Arc<Self>, first: Job) {
        let mut job = Some(first);
        loop {
            if let Some(j) = job.take() {
                j();
            }
            let mut st = self.lock();
            loop {
                if let Some(j) = st.queue.pop_front() {
                    self.publish(&st);
                    job = Some(j);
                    break;
                }
                st.idle += 1;
                self.publish(&st);
                let (guard, wait) = self.work.wait_timeout(st, IDLE_EXIT).unwrap_or_else(|e| e.into_inner());
                st = guard;
                st.idle -= 1;
                if wait.timed_out() && st.queue.is_empty() {
                    st.threads -= 1;
                    self.publish(&st);
                    return;
                }
            }
        }
    }
}

/// The blocking pool's counters (the Sun proxy's "Native pools" section of perfdump).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct NativePool {
    /// Threads waiting for work now ("Idle").
    pub idle_threads: usize,
    /// Threads alive now (busy or idle).
    pub threads: usize,
    /// Most threads ever alive at once ("Peak").
    pub peak_threads: usize,
    /// `server.blocking_threads` ("Limit").
    pub max_threads: usize,
    /// Jobs waiting for a thread now ("Work Queue Length").
    pub queue_length: usize,
    /// Most jobs ever waiting at once ("Work Queue Peak").
    pub queue_peak: usize,
    /// `server.blocking_queue` ("Work Queue Limit"); beyond it new disk work gets 503.
    pub queue_limit: usize,
    /// Jobs accepted since start.
    pub jobs: u64,
    /// Jobs refused because the queue was full (each a busy 503).
    pub refused: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queues_refuses_and_recovers() {
        let pool = BlockingPool::new(1, 1);
        let (release, gate) = mpsc::channel::<()>();
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let busy = tokio::spawn({
            let pool = pool.clone();
            async move {
                pool.run(move || {
                    let _ = started_tx.send(());
                    gate.recv().ok();
                    1
                })
                .await
            }
        });
        started.await.expect("first job started");
        let queued = tokio::spawn({
            let pool = pool.clone();
            async move { pool.try_run(|| 2).await }
        });
        while pool.snapshot().queue_length < 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(pool.try_run(|| 3).await, Err(PoolError::Busy));
        release.send(()).expect("release");
        assert_eq!(busy.await.expect("join"), Ok(1));
        assert_eq!(queued.await.expect("join"), Ok(2));
        let s = pool.snapshot();
        assert_eq!((s.threads, s.peak_threads, s.max_threads), (1, 1, 1));
        assert_eq!((s.queue_length, s.queue_peak, s.queue_limit), (0, 1, 1));
        assert_eq!((s.jobs, s.refused), (2, 1));
    }

    #[tokio::test]
    async fn a_panicking_job_fails_alone() {
        let pool = BlockingPool::new(1, 4);
        assert_eq!(pool.run(|| -> u8 { panic!("boom") }).await, Err(PoolError::Failed));
        assert_eq!(pool.run(|| 5).await, Ok(5));
    }
}
