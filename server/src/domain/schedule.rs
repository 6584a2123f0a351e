//! Schedules of recurring cards: crontab's five fields or an @shorthand, in an IANA time zone.
//!
//! Parsing and stepping are croner's, configured for crontab: five fields only, day-of-month OR
//! day-of-week when both are restricted, 0 and 7 both Sunday. Croner's extensions (`L`, `W`, `#`,
//! `+`, `?`) are refused here so that an expression means what it would mean in a crontab.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use super::{Error, Result};

const SHORTHANDS: [&str; 5] = ["@hourly", "@daily", "@weekly", "@monthly", "@yearly"];
const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
const FIELDS: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];

#[derive(Debug, Clone)]
pub struct Schedule {
    expr: String,
    zone: Tz,
    cron: Cron,
}

fn invalid(expr: &str, why: impl std::fmt::Display) -> Error {
    Error::invalid(format!(
        "invalid schedule {expr:?}: {why}. Use five fields (minute hour day-of-month month day-of-week, e.g. \"0 9 * * 1-5\" for 09:00 on weekdays) or @hourly, @daily, @weekly, @monthly, @yearly"
    ))
}

/// Each field is crontab syntax: `*`, numbers, names, and `,` `-` `/` between them.
fn check_field(expr: &str, index: usize, field: &str) -> Result<()> {
    let names: &[&str] = match index {
        3 => &MONTHS,
        4 => &DAYS,
        _ => &[],
    };
    for part in field.split(',') {
        let (range, step) = part.split_once('/').map_or((part, None), |(r, s)| (r, Some(s)));
        if let Some(step) = step
            && (step.is_empty() || !step.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(invalid(expr, format!("the {} field has a bad step {part:?}", FIELDS[index])));
        }
        for atom in range.split('-') {
            let ok = atom == "*" && range == "*"
                || (!atom.is_empty() && atom.bytes().all(|b| b.is_ascii_digit()))
                || names.contains(&atom.to_ascii_lowercase().as_str());
            if !ok {
                return Err(invalid(
                    expr,
                    format!("the {} field has {part:?}, which crontab does not accept", FIELDS[index]),
                ));
            }
        }
    }
    Ok(())
}

impl Schedule {
    pub fn parse(expr: &str, zone: &str) -> Result<Self> {
        let zone: Tz = zone.parse().map_err(|_| {
            Error::invalid(format!("unknown time zone {zone:?}: use an IANA name such as Europe/Berlin or UTC"))
        })?;
        let text = expr.split_whitespace().collect::<Vec<_>>().join(" ");
        if text.starts_with('@') {
            let lower = text.to_ascii_lowercase();
            if !SHORTHANDS.contains(&lower.as_str()) {
                return Err(invalid(expr, format!("unknown shorthand {text}")));
            }
        } else {
            let fields: Vec<&str> = text.split(' ').collect();
            if fields.len() != 5 {
                return Err(invalid(
                    expr,
                    format!("it has {} fields, not 5", if text.is_empty() { 0 } else { fields.len() }),
                ));
            }
            for (i, field) in fields.iter().enumerate() {
                check_field(expr, i, field)?;
            }
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(&text)
            .map_err(|e| invalid(expr, e))?;
        Ok(Self { expr: text, zone, cron })
    }

    pub fn expr(&self) -> &str {
        &self.expr
    }

    pub fn zone(&self) -> &str {
        self.zone.name()
    }

    /// The first run strictly after `after`, in UTC. A local time skipped by a DST change runs at
    /// the first instant after the gap; a repeated one runs once.
    pub fn next_after(&self, after: DateTime<Utc>) -> Result<DateTime<Utc>> {
        let local = after.with_timezone(&self.zone);
        self.cron
            .find_next_occurrence(&local, false)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| Error::invalid(format!("schedule {:?} never comes due: {e}", self.expr)))
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    fn next_local(expr: &str, zone: &str, from_utc: DateTime<Utc>, n: usize) -> Vec<String> {
        let s = Schedule::parse(expr, zone).unwrap();
        let mut t = from_utc;
        (0..n)
            .map(|_| {
                t = s.next_after(t).unwrap();
                t.with_timezone(&s.zone).format("%a %Y-%m-%d %H:%M %Z").to_string()
            })
            .collect()
    }

    #[test]
    fn weekday_numbering_is_crontabs() {
        // 2026-11-29 is a Sunday.
        let from = utc(2026, 11, 29, 12, 0);
        assert_eq!(next_local("0 9 * * 0", "UTC", from, 1), ["Sun 2026-12-06 09:00 UTC"]);
        assert_eq!(next_local("0 9 * * 7", "UTC", from, 1), ["Sun 2026-12-06 09:00 UTC"], "7 is Sunday too");
        assert_eq!(next_local("0 9 * * 1", "UTC", from, 1), ["Mon 2026-11-30 09:00 UTC"]);
        assert_eq!(next_local("0 9 * * sat", "UTC", from, 1), ["Sat 2026-12-05 09:00 UTC"]);
        assert_eq!(
            next_local("0 9 * * 1-5", "UTC", utc(2026, 12, 4, 12, 0), 2),
            ["Mon 2026-12-07 09:00 UTC", "Tue 2026-12-08 09:00 UTC"],
            "weekdays skip the weekend"
        );
    }

    #[test]
    fn day_of_month_or_day_of_week_as_cron_does() {
        // Both restricted: either matches (Fridays, and the 13th).
        assert_eq!(
            next_local("0 0 13 * 5", "UTC", utc(2026, 11, 1, 0, 0), 3),
            ["Fri 2026-11-06 00:00 UTC", "Fri 2026-11-13 00:00 UTC", "Fri 2026-11-20 00:00 UTC"]
        );
        assert_eq!(
            next_local("0 0 10 * 5", "UTC", utc(2026, 11, 7, 0, 0), 2),
            ["Tue 2026-11-10 00:00 UTC", "Fri 2026-11-13 00:00 UTC"]
        );
        // Only one restricted: only it counts.
        assert_eq!(next_local("0 0 13 * *", "UTC", utc(2026, 11, 1, 0, 0), 1), ["Fri 2026-11-13 00:00 UTC"]);
    }

    #[test]
    fn month_ends() {
        assert_eq!(
            next_local("0 0 31 * *", "UTC", utc(2026, 1, 31, 1, 0), 2),
            ["Tue 2026-03-31 00:00 UTC", "Sun 2026-05-31 00:00 UTC"],
            "months without a 31st are skipped"
        );
        assert_eq!(
            next_local("0 0 29 2 *", "UTC", utc(2026, 3, 1, 0, 0), 1),
            ["Tue 2028-02-29 00:00 UTC"],
            "the next leap day"
        );
        assert_eq!(next_local("@monthly", "UTC", utc(2026, 12, 15, 0, 0), 1), ["Fri 2027-01-01 00:00 UTC"]);
        assert_eq!(next_local("@yearly", "UTC", utc(2026, 12, 15, 0, 0), 1), ["Fri 2027-01-01 00:00 UTC"]);
    }

    #[test]
    fn daylight_saving_in_a_named_zone() {
        // New York springs forward at 02:00 on 2026-03-08: 02:30 does not exist that day.
        assert_eq!(
            next_local("30 2 * * *", "America/New_York", utc(2026, 3, 7, 17, 0), 3),
            ["Sun 2026-03-08 03:00 EDT", "Mon 2026-03-09 02:30 EDT", "Tue 2026-03-10 02:30 EDT"]
        );
        // It falls back at 02:00 on 2026-11-01: 01:30 happens twice, the run once.
        assert_eq!(
            next_local("30 1 * * *", "America/New_York", utc(2026, 10, 31, 16, 0), 2),
            ["Sun 2026-11-01 01:30 EDT", "Mon 2026-11-02 01:30 EST"]
        );
        // 09:00 local is 14:00 UTC in winter and 13:00 UTC in summer.
        let s = Schedule::parse("0 9 * * *", "America/New_York").unwrap();
        assert_eq!(s.next_after(utc(2026, 1, 10, 0, 0)).unwrap(), utc(2026, 1, 10, 14, 0));
        assert_eq!(s.next_after(utc(2026, 7, 10, 0, 0)).unwrap(), utc(2026, 7, 10, 13, 0));
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        for (expr, expect) in [
            ("* * * *", "4 fields"),
            ("* * * * * *", "6 fields"),
            ("", "0 fields"),
            ("61 * * * *", "out of bounds"),
            ("0 0 L * *", "day-of-month field has \"L\""),
            ("0 0 * * 1#2", "day-of-week field has \"1#2\""),
            ("0 0 * * +1", "day-of-week field"),
            ("0 0 ? * *", "day-of-month field"),
            ("@often", "unknown shorthand"),
            ("*/x * * * *", "bad step"),
            ("0 0 * foo *", "month field"),
        ] {
            let err = Schedule::parse(expr, "UTC").unwrap_err().to_string();
            assert!(err.contains(expect), "{expr}: {err}");
            assert!(err.contains("Use five fields"), "{err}");
        }
        assert!(Schedule::parse("@daily", "Mars/Olympus").unwrap_err().to_string().contains("unknown time zone"));
        assert_eq!(Schedule::parse("  0   9 * *  MON-FRI ", "UTC").unwrap().expr(), "0 9 * * MON-FRI");
    }
}
