//! Calendar arithmetic and date-time parsing, without a date crate: the
//! gateway reads device times, the cloud provider records' times and
//! month boundaries. Howard Hinnant's civil calendar algorithms, exact for
//! the proleptic Gregorian calendar.

/// RFC 3339 / ISO 8601 date-times as providers send them, to ms since the
/// epoch: `2024-03-01T15:04:05Z`, fractions of any length, offsets as
/// `+05:30` or `+0530` (Salesforce), no offset read as UTC (WooCommerce's
/// `*_gmt` fields), and a bare date as its midnight UTC.
pub fn parse_datetime_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(range)?;
        if part.iter().all(u8::is_ascii_digit) {
            std::str::from_utf8(part).ok()?.parse().ok()
        } else {
            None
        }
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
        return None;
    }
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    if b.len() == 10 {
        return Some(days * 86_400_000);
    }
    if !matches!(b.get(10), Some(b'T' | b't' | b' ')) || b.get(13) != Some(&b':') {
        return None;
    }
    let (hour, minute) = (num(11..13)?, num(14..16)?);
    let mut at = 16;
    let mut second = 0;
    if b.get(at) == Some(&b':') {
        second = num(17..19)?;
        at = 19;
    }
    let mut millis = 0;
    if b.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while b.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        if at == start {
            return None;
        }
        let digits = &text[start..at.min(start + 3)];
        millis = digits.parse::<i64>().ok()? * 10_i64.pow(3 - digits.len() as u32);
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let offset_minutes = match &b[at..] {
        [] | [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), rest @ ..] => {
            let (h, m) = match rest {
                [h1, h2] => (&[*h1, *h2][..], &b"00"[..]),
                [h1, h2, b':', m1, m2] | [h1, h2, m1, m2] => (&[*h1, *h2][..], &[*m1, *m2][..]),
                _ => return None,
            };
            let parse = |d: &[u8]| -> Option<i64> {
                d.iter()
                    .all(u8::is_ascii_digit)
                    .then(|| d.iter().fold(0_i64, |acc, c| acc * 10 + i64::from(c - b'0')))
            };
            let minutes = parse(h)? * 60 + parse(m)?;
            if *sign == b'-' { -minutes } else { minutes }
        }
        _ => return None,
    };
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1000 + millis)
}

pub fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Year, month (1 to 12) and day of the month of a day since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn date_times_in_the_spellings_seen() {
        let at = |s| parse_datetime_ms(s);
        assert_eq!(at("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(at("2024-03-01T15:04:05Z"), Some(1_709_305_445_000));
        assert_eq!(at("2024-03-01T15:04:05.123Z"), Some(1_709_305_445_123));
        assert_eq!(at("2024-03-01T15:04:05.000+0000"), Some(1_709_305_445_000));
        assert_eq!(at("2024-03-01T10:04:05-05:00"), Some(1_709_305_445_000));
        assert_eq!(at("2024-03-01T20:34:05.5+05:30"), Some(1_709_305_445_500));
        assert_eq!(at("2024-03-01T15:04:05"), Some(1_709_305_445_000));
        assert_eq!(at("2024-03-01 15:04"), Some(1_709_305_440_000));
        assert_eq!(at("2024-03-01"), Some(1_709_251_200_000));
        assert_eq!(at("2024-02-29"), Some(1_709_164_800_000));
        for bad in [
            "",
            "2024",
            "2023-02-29",
            "2024-13-01",
            "2024-03-01T25:00:00Z",
            "yesterday",
            "2024-03-01T15:04:05+5",
            "2024-03-01T15:04:05.Z",
            "2024-03-01T15:04:05Zjunk",
        ] {
            assert_eq!(at(bad), None, "{bad}");
        }
    }

    #[test]
    fn days_go_there_and_back() {
        for days in [-800_000, -1, 0, 59, 60, 10_956, 20_000, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert!((1..=12).contains(&m) && (1..=days_in_month(y, m)).contains(&d));
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_in_month(2024, 2), 29);
        assert_eq!(days_in_month(2100, 2), 28);
        assert_eq!(days_in_month(2000, 2), 29);
    }
}
