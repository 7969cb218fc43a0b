//! SQLite's process-wide settings. SQLite takes them only before it
//! initialises, which rusqlite makes it do at the first connection a
//! process opens, so [`install`] runs first on every path that opens the
//! store. If something else opened a connection earlier, SQLite keeps its
//! defaults: slower, equally correct.
//!
//! - Allocation statistics off: with them on, every allocation and free
//!   SQLite makes takes one process-wide mutex, which the writer, the
//!   search indexer and the readers all share, and nothing reads them.
//! - SQLite allocates through mimalloc, the cloud's allocator, instead of
//!   glibc. The writer's own allocations are mostly blocks glibc keeps in
//!   sorted free lists: the in-memory journal of each request's savepoint
//!   (1 KiB chunks) and B-tree balancing's scratch space (about 20 KiB).
//!   Walking those lists was about a quarter of the writer thread in
//!   single-event ingest (BENCHMARKS.md, 27 November).
//! - The page cache is `page_cache`'s.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use rusqlite::ffi;

static INSTALLED: OnceLock<bool> = OnceLock::new();

/// Applies the settings, once per process. Answers whether they are in
/// place.
pub(super) fn install() -> bool {
    *INSTALLED.get_or_init(|| {
        // SAFETY: `get_or_init` runs this once, and the store's paths call
        // `install` before they open any connection, so SQLite is not
        // initialising meanwhile; SQLite refuses (SQLITE_MISUSE) what comes
        // after it has.
        let installed = unsafe { try_install() };
        if !installed {
            tracing::warn!("SQLite was initialised before the store: its slower defaults stay");
        }
        installed
    })
}

unsafe fn try_install() -> bool {
    let mimalloc = ffi::sqlite3_mem_methods {
        xMalloc: Some(malloc),
        xFree: Some(free),
        xRealloc: Some(realloc),
        xSize: Some(size),
        xRoundup: Some(roundup),
        xInit: Some(init),
        xShutdown: Some(shutdown),
        pAppData: std::ptr::null_mut(),
    };
    // SAFETY: the calls only set SQLite's global configuration, which it
    // allows before it initialises; it copies the methods table.
    unsafe {
        ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, c_int::from(false)) == ffi::SQLITE_OK
            && ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &raw const mimalloc) == ffi::SQLITE_OK
            && super::page_cache::install()
    }
}

// SQLite's memory allocator interface (`sqlite3_mem_methods`) over
// mimalloc. SAFETY, for all of them: SQLite passes only pointers these
// functions returned and has not freed; it never asks for 0 bytes or fewer.

unsafe extern "C" fn malloc(bytes: c_int) -> *mut c_void {
    match usize::try_from(bytes) {
        Ok(bytes) => unsafe { libmimalloc_sys::mi_malloc(bytes) },
        Err(_) => std::ptr::null_mut(),
    }
}

unsafe extern "C" fn free(p: *mut c_void) {
    unsafe { libmimalloc_sys::mi_free(p) }
}

unsafe extern "C" fn realloc(p: *mut c_void, bytes: c_int) -> *mut c_void {
    match usize::try_from(bytes) {
        Ok(bytes) => unsafe { libmimalloc_sys::mi_realloc(p, bytes) },
        Err(_) => std::ptr::null_mut(),
    }
}

unsafe extern "C" fn size(p: *mut c_void) -> c_int {
    let bytes = unsafe { libmimalloc_sys::mi_usable_size(p) };
    c_int::try_from(bytes).unwrap_or(c_int::MAX)
}

unsafe extern "C" fn roundup(bytes: c_int) -> c_int {
    match usize::try_from(bytes) {
        Ok(n) => c_int::try_from(unsafe { libmimalloc_sys::mi_good_size(n) }).unwrap_or(bytes),
        Err(_) => bytes,
    }
}

unsafe extern "C" fn init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn shutdown(_: *mut c_void) {}

#[cfg(test)]
mod tests {
    use rusqlite::ffi;

    /// The settings took, and SQLite works on them.
    #[test]
    fn sqlite_allocates_through_mimalloc_and_keeps_no_statistics() {
        assert!(super::install(), "every path that opens the store installs the settings first");
        let conn = rusqlite::Connection::open_in_memory().expect("open an in-memory database");
        let text: String = conn
            .query_row(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
                 SELECT group_concat(i, ',') FROM n",
                [],
                |r| r.get(0),
            )
            .expect("a query that allocates");
        assert!(text.ends_with(",20000"));
        // SAFETY: a block SQLite allocates and frees; plain out-parameters.
        unsafe {
            let p = ffi::sqlite3_malloc(1000);
            assert!(!p.is_null());
            assert!(libmimalloc_sys::mi_check_owned(p), "SQLite allocated through glibc");
            ffi::sqlite3_free(p);
            let (mut current, mut peak) = (0, 0);
            let status =
                ffi::sqlite3_status(ffi::SQLITE_STATUS_MEMORY_USED, &mut current, &mut peak, 0);
            assert_eq!(status, ffi::SQLITE_OK);
            assert_eq!(current, 0, "allocation statistics are on");
        }
    }
}
