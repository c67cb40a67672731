//! The process's memory allocator: jemalloc, with the `jemalloc` feature (on by default).
//!
//! Every binary that links this library allocates through it: `tollgate` itself, and the
//! benchmarks' empty RLS server, so that the floor a decision is measured against runs on the
//! same allocator. A build without the feature uses the C library's allocator.
//!
//! Why not glibc's: a decision's blocks are often freed on another worker thread than the one
//! that allocated them (tokio moves tasks between workers, and the Redis client's connection task
//! answers on its own), and glibc gives such a block back to its own arena under that arena's
//! lock. With two workers, most decisions met that lock held, and waiting on it took more system
//! calls (`futex`) than reading and writing the sockets. jemalloc returns such blocks through a
//! per-thread cache in batches. docs/dev/performance-history.md ("The runtime and the allocator") has the numbers.

/// jemalloc, configured by [`JEMALLOC_CONF`].
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main` runs (the `_RJEM_MALLOC_CONF` variable adds to them at
/// run time). A background thread returns freed pages to the system after about a second idle
/// (`dirty_decay_ms`, and no lazily freed `muzzy` stage): without it, jemalloc purges only when a
/// thread allocates again, so memory freed before a quiet period stayed resident, which a
/// sidecar's memory limit counts.
#[cfg(feature = "jemalloc")]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static JEMALLOC_CONF: Option<&'static std::ffi::c_char> = Some(
    // SAFETY: the pointer is to the first byte of a static, NUL-terminated string, which jemalloc
    // only reads.
    unsafe { &*c"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0".as_ptr() },
);
