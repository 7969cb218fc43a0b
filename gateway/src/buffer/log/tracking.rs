//! Small bounded bookkeeping beside the log: where reads can resume, and
//! which corrupt sequence numbers were already counted.

use std::collections::BTreeMap;

/// Most position hints kept; beyond that the oldest are forgotten (a read
/// then scans from the segment start: slower, still correct).
const MAX_HINTS: usize = 1024;

/// Known record boundaries: sequence number to (segment, offset), so a read
/// from the middle of a segment does not rescan it from the start.
#[derive(Debug, Default)]
pub(super) struct Hints {
    by_seq: BTreeMap<u64, (u64, u64)>,
}

impl Hints {
    /// Remembers that the record `seq` of segment `segment` starts at
    /// `offset` (or would, once written).
    pub(super) fn insert(&mut self, seq: u64, segment: u64, offset: u64) {
        self.by_seq.insert(seq, (segment, offset));
        if self.by_seq.len() > MAX_HINTS {
            self.by_seq.pop_first();
        }
    }

    /// The best place to start looking for `from` in `segment`: (offset,
    /// sequence expected there), `None` to start at the beginning.
    pub(super) fn lookup(&self, segment: u64, from: u64) -> Option<(u64, u64)> {
        let (&seq, &(seg, offset)) = self.by_seq.range(segment..=from).next_back()?;
        (seg == segment).then_some((offset, seq))
    }

    /// Forgets hints below `seq` (acknowledged or dropped).
    pub(super) fn forget_below(&mut self, seq: u64) {
        self.by_seq = self.by_seq.split_off(&seq);
    }
}

/// A set of sequence numbers as disjoint inclusive ranges, so a corrupt
/// record read many times (redelivery) is counted once.
#[derive(Debug, Default)]
pub(super) struct SeqRanges {
    ranges: BTreeMap<u64, u64>,
}

impl SeqRanges {
    /// Adds `first..=last` and returns how many numbers were new.
    pub(super) fn add(&mut self, first: u64, last: u64) -> u64 {
        if first > last {
            return 0;
        }
        let (mut lo, mut hi, mut known) = (first, last, 0);
        let touching: Vec<(u64, u64)> = self
            .ranges
            .range(..=last.saturating_add(1))
            .rev()
            .take_while(|&(_, &end)| end.saturating_add(1) >= first)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (start, end) in touching {
            let (a, b) = (start.max(first), end.min(last));
            if a <= b {
                known += b - a + 1;
            }
            lo = lo.min(start);
            hi = hi.max(end);
            self.ranges.remove(&start);
        }
        self.ranges.insert(lo, hi);
        (last - first + 1) - known
    }

    /// Forgets numbers below `seq`.
    pub(super) fn forget_below(&mut self, seq: u64) {
        let mut kept = self.ranges.split_off(&seq);
        if let Some((&start, &end)) = self.ranges.iter().next_back()
            && end >= seq
        {
            kept.insert(seq.max(start), end);
        }
        self.ranges = kept;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_count_each_number_once() {
        let mut set = SeqRanges::default();
        assert_eq!(set.add(10, 12), 3);
        assert_eq!(set.add(10, 12), 0);
        assert_eq!(set.add(11, 15), 3);
        assert_eq!(set.add(5, 5), 1);
        assert_eq!(set.add(6, 9), 4); // bridges 5 and 10..=15
        assert_eq!(set.ranges.len(), 1);
        assert_eq!(set.add(1, 20), 9);
        set.forget_below(8);
        assert_eq!(set.ranges.iter().next(), Some((&8, &20)));
        assert_eq!(set.add(7, 8), 1);
    }

    #[test]
    fn hints_stay_within_their_segment() {
        let mut hints = Hints::default();
        hints.insert(15, 10, 500);
        hints.insert(30, 20, 100);
        assert_eq!(hints.lookup(10, 17), Some((500, 15)));
        assert_eq!(hints.lookup(20, 25), None);
        assert_eq!(hints.lookup(20, 31), Some((100, 30)));
        hints.forget_below(20);
        assert_eq!(hints.lookup(10, 17), None);
        for i in 0..2 * MAX_HINTS as u64 {
            hints.insert(100 + i, 100, i);
        }
        assert_eq!(hints.by_seq.len(), MAX_HINTS);
    }
}
