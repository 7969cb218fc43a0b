//! SQLite's own page cache, wrapped so that a commit skips a scan that
//! finds nothing.
//!
//! At the end of every transaction SQLite asks the page cache to drop the
//! pages past the end of the database file. The default cache does that by
//! scanning its whole hash table whenever the highest page number it has
//! ever been given since the last such drop lies far past that end. B-tree
//! balancing gives one: to swap two new pages it parks one, for a moment,
//! under the number of the page after the 1 GiB lock byte (262,145 at 4 KiB
//! pages). So until the database passes 1 GiB, most commits that split a
//! page scan every page the writer caches, and the writer caches up to
//! 256 MiB: in single-event ingest that scan was 41 % of the writer thread
//! once the cache had filled (BENCHMARKS.md, 27 November).
//!
//! The wrapper passes every call through to the default cache and keeps,
//! beside it, an upper bound of the pages that cache can hold ([`Extent`]).
//! A drop that the bound shows to be empty is not passed on. Nothing else
//! changes: same pages, same memory, same eviction. The cost is a few
//! comparisons per page fetch.
//!
//! SQLite takes a page cache only before it initialises; `sqlite_config`
//! installs this one with the rest of SQLite's process-wide settings.
#![allow(unsafe_code)]

#[cfg(test)]
use std::cell::Cell;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::OnceLock;

use rusqlite::ffi;
use rusqlite::ffi::{sqlite3_pcache as Pcache, sqlite3_pcache_page as Page};

/// Which page numbers a cache may hold, as far as a truncation needs to
/// know: every page it holds is numbered at most `fetched`, or is one of
/// `moved`.
#[derive(Debug, Default)]
struct Extent {
    /// The highest page number a fetch could have created a page for since
    /// the last truncation passed on.
    fetched: u32,
    /// Numbers above `fetched` that a rekey moved a page to, while that
    /// page stays there.
    moved: Vec<u32>,
    /// The highest number fetched or rekeyed to since the last truncation
    /// passed on: the default cache's own bound, past which it scans. Only
    /// tests read it, to count the scans spared.
    #[cfg(test)]
    reached: u32,
}

impl Extent {
    fn fetch(&mut self, key: u32) {
        self.fetched = self.fetched.max(key);
        #[cfg(test)]
        {
            self.reached = self.reached.max(key);
        }
    }

    fn rekey(&mut self, old: u32, new: u32) {
        #[cfg(test)]
        {
            self.reached = self.reached.max(new);
        }
        self.moved.retain(|&k| k != old);
        if new > self.fetched {
            self.moved.push(new);
        }
    }

    /// Whether the cache may hold a page numbered `limit` or more, which a
    /// truncation to `limit` must drop.
    fn reaches(&self, limit: u32) -> bool {
        self.fetched >= limit || self.moved.iter().any(|&k| k >= limit)
    }

    fn truncated(&mut self, limit: u32) {
        self.fetched = self.fetched.min(limit.saturating_sub(1));
        #[cfg(test)]
        {
            self.reached = self.reached.min(limit.saturating_sub(1));
        }
        self.moved.retain(|&k| k < limit);
    }
}

/// SQLite's default page cache methods, every one present.
struct Methods {
    arg: *mut c_void,
    init: unsafe extern "C" fn(*mut c_void) -> c_int,
    shutdown: unsafe extern "C" fn(*mut c_void),
    create: unsafe extern "C" fn(c_int, c_int, c_int) -> *mut Pcache,
    cachesize: unsafe extern "C" fn(*mut Pcache, c_int),
    pagecount: unsafe extern "C" fn(*mut Pcache) -> c_int,
    fetch: unsafe extern "C" fn(*mut Pcache, c_uint, c_int) -> *mut Page,
    unpin: unsafe extern "C" fn(*mut Pcache, *mut Page, c_int),
    rekey: unsafe extern "C" fn(*mut Pcache, *mut Page, c_uint, c_uint),
    truncate: unsafe extern "C" fn(*mut Pcache, c_uint),
    destroy: unsafe extern "C" fn(*mut Pcache),
    shrink: unsafe extern "C" fn(*mut Pcache),
}

// SAFETY: the functions are SQLite's, which serialises what they share
// itself; `arg` is only handed back to them, never dereferenced here.
unsafe impl Sync for Methods {}
unsafe impl Send for Methods {}

impl Methods {
    fn of(m: &ffi::sqlite3_pcache_methods2) -> Option<Methods> {
        Some(Methods {
            arg: m.pArg,
            init: m.xInit?,
            shutdown: m.xShutdown?,
            create: m.xCreate?,
            cachesize: m.xCachesize?,
            pagecount: m.xPagecount?,
            fetch: m.xFetch?,
            unpin: m.xUnpin?,
            rekey: m.xRekey?,
            truncate: m.xTruncate?,
            destroy: m.xDestroy?,
            shrink: m.xShrink?,
        })
    }
}

static DEFAULT: OnceLock<Methods> = OnceLock::new();

#[cfg(test)]
thread_local! {
    /// Truncations this thread did not pass on and the default cache
    /// would have scanned for, which tests read.
    static SPARED: Cell<u64> = const { Cell::new(0) };
}

/// One cache: the default cache's, and the bound of what it holds. Only
/// the connection that owns a cache calls its methods, and a connection is
/// used by one thread at a time, so the bound needs no lock.
struct Cache {
    inner: *mut Pcache,
    default: &'static Methods,
    extent: Extent,
}

/// Puts the wrapper in place of SQLite's default page cache; false when
/// SQLite refused (it is initialised already).
///
/// # Safety
///
/// SQLite must not be initialised yet, nor be initialising on another
/// thread.
pub(super) unsafe fn install() -> bool {
    // SAFETY: both calls only copy a methods table (out, then in), which
    // SQLite allows before it initialises.
    unsafe {
        let mut default: ffi::sqlite3_pcache_methods2 = std::mem::zeroed();
        if ffi::sqlite3_config(ffi::SQLITE_CONFIG_GETPCACHE2, &raw mut default) != ffi::SQLITE_OK {
            return false;
        }
        let Some(default) = Methods::of(&default) else { return false };
        if DEFAULT.set(default).is_err() {
            return false;
        }
        let wrapper = ffi::sqlite3_pcache_methods2 {
            iVersion: 1,
            pArg: std::ptr::null_mut(),
            xInit: Some(init),
            xShutdown: Some(shutdown),
            xCreate: Some(create),
            xCachesize: Some(cachesize),
            xPagecount: Some(pagecount),
            xFetch: Some(fetch),
            xUnpin: Some(unpin),
            xRekey: Some(rekey),
            xTruncate: Some(truncate),
            xDestroy: Some(destroy),
            xShrink: Some(shrink),
        };
        // SQLite copies the table.
        ffi::sqlite3_config(ffi::SQLITE_CONFIG_PCACHE2, &raw const wrapper) == ffi::SQLITE_OK
    }
}

/// How many scans of the default cache this thread was spared.
#[cfg(test)]
pub(super) fn spared() -> u64 {
    SPARED.get()
}

// The functions below are SQLite's page cache interface (`sqlite3_pcache_methods2`).
// SAFETY, for all of them: SQLite calls them as that interface documents, with
// cache pointers that `create` returned and `destroy` has not yet taken back.

unsafe extern "C" fn init(_: *mut c_void) -> c_int {
    match DEFAULT.get() {
        Some(d) => unsafe { (d.init)(d.arg) },
        None => ffi::SQLITE_ERROR,
    }
}

unsafe extern "C" fn shutdown(_: *mut c_void) {
    if let Some(d) = DEFAULT.get() {
        unsafe { (d.shutdown)(d.arg) }
    }
}

unsafe extern "C" fn create(page: c_int, extra: c_int, purgeable: c_int) -> *mut Pcache {
    let Some(default) = DEFAULT.get() else { return std::ptr::null_mut() };
    let inner = unsafe { (default.create)(page, extra, purgeable) };
    if inner.is_null() {
        return inner;
    }
    Box::into_raw(Box::new(Cache { inner, default, extent: Extent::default() })).cast()
}

/// The cache behind a pointer that `create` returned.
unsafe fn cache<'a>(p: *mut Pcache) -> &'a mut Cache {
    unsafe { &mut *p.cast::<Cache>() }
}

unsafe extern "C" fn cachesize(p: *mut Pcache, pages: c_int) {
    let c = unsafe { cache(p) };
    unsafe { (c.default.cachesize)(c.inner, pages) }
}

unsafe extern "C" fn pagecount(p: *mut Pcache) -> c_int {
    let c = unsafe { cache(p) };
    unsafe { (c.default.pagecount)(c.inner) }
}

unsafe extern "C" fn fetch(p: *mut Pcache, key: c_uint, create: c_int) -> *mut Page {
    let c = unsafe { cache(p) };
    if create != 0 {
        c.extent.fetch(key);
    }
    unsafe { (c.default.fetch)(c.inner, key, create) }
}

unsafe extern "C" fn unpin(p: *mut Pcache, page: *mut Page, discard: c_int) {
    let c = unsafe { cache(p) };
    unsafe { (c.default.unpin)(c.inner, page, discard) }
}

unsafe extern "C" fn rekey(p: *mut Pcache, page: *mut Page, old: c_uint, new: c_uint) {
    let c = unsafe { cache(p) };
    c.extent.rekey(old, new);
    unsafe { (c.default.rekey)(c.inner, page, old, new) }
}

unsafe extern "C" fn truncate(p: *mut Pcache, limit: c_uint) {
    let c = unsafe { cache(p) };
    if c.extent.reaches(limit) {
        unsafe { (c.default.truncate)(c.inner, limit) };
        c.extent.truncated(limit);
    } else {
        #[cfg(test)]
        if c.extent.reached >= limit {
            SPARED.set(SPARED.get() + 1);
        }
    }
}

unsafe extern "C" fn destroy(p: *mut Pcache) {
    let c = unsafe { Box::from_raw(p.cast::<Cache>()) };
    unsafe { (c.default.destroy)(c.inner) }
}

unsafe extern "C" fn shrink(p: *mut Pcache) {
    let c = unsafe { cache(p) };
    unsafe { (c.default.shrink)(c.inner) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page number B-tree balancing parks a page under (4 KiB pages).
    const PARKING: u32 = (1 << 30) / 4096 + 1;

    #[test]
    fn a_page_parked_and_moved_back_leaves_nothing_past_the_end() {
        let mut extent = Extent::default();
        (1..=100).for_each(|key| extent.fetch(key));
        // balance_nonroot swapping pages 90 and 95.
        extent.rekey(90, PARKING);
        extent.rekey(95, 90);
        extent.rekey(PARKING, 95);
        assert!(!extent.reaches(101));
        assert!(extent.reaches(100));
    }

    #[test]
    fn a_page_moved_past_the_end_and_left_there_is_dropped() {
        let mut extent = Extent::default();
        (1..=100).for_each(|key| extent.fetch(key));
        extent.rekey(7, 500);
        assert!(extent.reaches(101));
        extent.truncated(101);
        assert!(!extent.reaches(101));
        // Moved elsewhere before the drop: only where it went counts.
        extent.rekey(8, 600);
        extent.rekey(600, 9);
        assert!(!extent.reaches(101));
    }

    #[test]
    fn pages_added_then_rolled_back_are_dropped_and_the_bound_falls() {
        let mut extent = Extent::default();
        (1..=120).for_each(|key| extent.fetch(key));
        assert!(extent.reaches(101));
        extent.truncated(101);
        assert_eq!(extent.fetched, 100);
        assert!(extent.reaches(0), "a truncation to nothing is always passed on");
    }

    /// Drives the installed wrapper over SQLite's default cache directly:
    /// whatever it skips, the default cache must hold nothing to drop.
    #[test]
    fn the_wrapper_drops_what_the_default_cache_would_and_skips_the_rest() {
        assert!(
            crate::store::embedded::sqlite_config::install(),
            "every path that opens the store installs the cache first"
        );
        // SQLite initialises the caches' shared state at its first connection.
        rusqlite::Connection::open_in_memory().expect("open an in-memory database");
        // SAFETY: the calls follow the page cache interface: pages are
        // fetched with room for them, unpinned once, and the cache is
        // destroyed last.
        unsafe {
            let p = create(4096, 8, 1);
            assert!(!p.is_null());
            cachesize(p, 1000);
            let mut pages = Vec::new();
            for key in 1..=100 {
                let page = fetch(p, key, 2);
                assert!(!page.is_null());
                pages.push(page);
            }
            for &page in &pages {
                unpin(p, page, 0);
            }
            let page = |key: u32| fetch(p, key, 0);

            // A swap through the parking number, then a commit's drop.
            let (a, b) = (page(90), page(95));
            rekey(p, a, 90, PARKING);
            rekey(p, b, 95, 90);
            rekey(p, a, PARKING, 95);
            unpin(p, a, 0);
            unpin(p, b, 0);
            let before = spared();
            truncate(p, 101);
            assert_eq!(spared(), before + 1, "nothing past the end: not passed on");
            assert_eq!(pagecount(p), 100);

            // A page left past the end is dropped.
            let c = page(7);
            rekey(p, c, 7, 500);
            unpin(p, c, 0);
            truncate(p, 101);
            assert_eq!(pagecount(p), 99);
            assert!(page(500).is_null());

            // Pages added past the end (a rolled-back growth) are dropped.
            for key in 101..=110 {
                let page = fetch(p, key, 2);
                assert!(!page.is_null());
                unpin(p, page, 0);
            }
            assert_eq!(pagecount(p), 109);
            truncate(p, 101);
            assert_eq!(pagecount(p), 99);
            assert!(page(105).is_null());
            destroy(p);
        }
    }
}
