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

/// One of the five fields: its name, its range and the names it takes.
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    /// How a refusal words the range.
    range: &'static str,
    names: &'static [&'static str],
    /// The number of the first name.
    first_name: u32,
}

const FIELDS: [Field; 5] = [
    Field { name: "minute", min: 0, max: 59, range: "minutes run 0-59", names: &[], first_name: 0 },
    Field { name: "hour", min: 0, max: 23, range: "hours run 0-23", names: &[], first_name: 0 },
    Field { name: "day of month", min: 1, max: 31, range: "days of the month run 1-31", names: &[], first_name: 0 },
    Field { name: "month", min: 1, max: 12, range: "months run 1-12 (or jan-dec)", names: &MONTHS, first_name: 1 },
    Field {
        name: "day of week",
        min: 0,
        max: 7,
        range: "days of the week run 0-7 (0 and 7 are Sunday, or sun-sat)",
        names: &DAYS,
        first_name: 0,
    },
];

const FORM: &str = "five fields (minute hour day-of-month month day-of-week, e.g. \"0 9 * * 1-5\" for 09:00 on weekdays) or @hourly, @daily, @weekly, @monthly, @yearly";

#[derive(Debug, Clone)]
pub struct Schedule {
    expr: String,
    zone: Tz,
    cron: Cron,
}

/// A refusal naming the expression and what is wrong with it.
fn refuse(expr: &str, why: impl std::fmt::Display) -> Error {
    Error::invalid(format!("schedule {:?}: {why}", expr.trim()))
}

/// An expression whose fields each passed but which still cannot be run as a schedule.
fn unreadable(expr: &str) -> Error {
    refuse(
        expr,
        format!(
            "it cannot be read as a schedule: write {FORM}, with {}",
            FIELDS.iter().map(|f| f.range).collect::<Vec<_>>().join(", ")
        ),
    )
}

impl Field {
    /// A number or a name of this field, within its range.
    fn value(&self, expr: &str, atom: &str) -> Result<u32> {
        if !atom.is_empty() && atom.bytes().all(|b| b.is_ascii_digit()) {
            let n: u32 = atom.parse().unwrap_or(u32::MAX);
            if n < self.min || n > self.max {
                return Err(refuse(expr, format!("{} is {atom}, but {}", self.name, self.range)));
            }
            return Ok(n);
        }
        let lower = atom.to_ascii_lowercase();
        match self.names.iter().position(|n| *n == lower) {
            Some(i) => Ok(self.first_name + i as u32),
            None if self.names.is_empty() => Err(refuse(
                expr,
                format!(
                    "the {} field has {atom:?}, which crontab does not accept: use numbers, *, and , - / between them ({})",
                    self.name, self.range
                ),
            )),
            None => Err(refuse(
                expr,
                format!(
                    "the {} field has {atom:?}, which crontab does not accept: use numbers or names, *, and , - / between them ({})",
                    self.name, self.range
                ),
            )),
        }
    }

    /// Each part is `*`, a value or a range `a-b`, optionally with a step `/n`.
    fn check(&self, expr: &str, field: &str) -> Result<()> {
        for part in field.split(',') {
            let (range, step) = part.split_once('/').map_or((part, None), |(r, s)| (r, Some(s)));
            if let Some(step) = step {
                if step.is_empty() || !step.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(refuse(expr, format!("{} step {step:?} is not a number", self.name)));
                }
                let n: u32 = step.parse().unwrap_or(u32::MAX);
                if n == 0 || n > self.max {
                    return Err(refuse(expr, format!("{} step is {step}, but a step runs 1-{}", self.name, self.max)));
                }
            }
            if range == "*" {
                continue;
            }
            match range.split_once('-') {
                Some((from, to)) => {
                    let (a, b) = (self.value(expr, from)?, self.value(expr, to)?);
                    if a > b {
                        return Err(refuse(
                            expr,
                            format!("{} range {range} runs backwards: write the smaller end first", self.name),
                        ));
                    }
                }
                None => {
                    self.value(expr, range)?;
                }
            }
        }
        Ok(())
    }
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
                return Err(refuse(expr, format!("{text} is not a shorthand crontab knows: use {FORM}")));
            }
        } else {
            let fields: Vec<&str> = if text.is_empty() { Vec::new() } else { text.split(' ').collect() };
            if fields.len() != 5 {
                return Err(refuse(expr, format!("it has {} fields, but a schedule is {FORM}", fields.len())));
            }
            for (field, spec) in fields.iter().zip(&FIELDS) {
                spec.check(expr, field)?;
            }
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(&text)
            // Every field was checked above; should croner still refuse one, the refusal is ours,
            // not its words.
            .map_err(|_| unreadable(expr))?;
        Ok(Self { expr: text, zone, cron })
    }

    pub fn expr(&self) -> &str {
        &self.expr
    }

    pub fn zone(&self) -> &str {
        self.zone.name()
    }

    /// The slot after the one that came due (`slot`), judged by the database's clock (`now`): the
    /// first run after both, so a slot fires once however far a replica's own clock is off, and
    /// slots missed while nothing ran are not made up one by one.
    pub fn next_slot(&self, slot: DateTime<Utc>, now: DateTime<Utc>) -> Result<DateTime<Utc>> {
        self.next_after(slot.max(now))
    }

    /// The first run strictly after `after`, in UTC. A local time skipped by a DST change runs at
    /// the first instant after the gap; a repeated one runs once.
    pub fn next_after(&self, after: DateTime<Utc>) -> Result<DateTime<Utc>> {
        let local = after.with_timezone(&self.zone);
        self.cron.find_next_occurrence(&local, false).map(|t| t.with_timezone(&Utc)).map_err(|_| {
            Error::invalid(format!(
                "schedule {:?} never comes due: no date has the day of month, month and day of week it names",
                self.expr
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    #[test]
    fn the_next_slot_follows_the_slot_that_came_due_and_the_database_clock() {
        let every5 = Schedule::parse("*/5 * * * *", "UTC").unwrap();
        let slot = utc(2026, 3, 2, 10, 5);
        let just_after = slot + chrono::Duration::milliseconds(500);
        assert_eq!(every5.next_slot(slot, just_after).unwrap(), utc(2026, 3, 2, 10, 10), "a slot fires once");
        let behind = utc(2026, 3, 2, 10, 4);
        assert_eq!(every5.next_slot(slot, behind).unwrap(), utc(2026, 3, 2, 10, 10), "never the same slot again");
        let much_later = utc(2026, 3, 2, 11, 2);
        assert_eq!(
            every5.next_slot(slot, much_later).unwrap(),
            utc(2026, 3, 2, 11, 5),
            "missed slots are not replayed"
        );
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

    fn refusal(expr: &str) -> String {
        Schedule::parse(expr, "UTC").unwrap_err().to_string()
    }

    #[test]
    fn each_field_names_its_value_and_range() {
        for (expr, expect) in [
            ("60 * * * *", "schedule \"60 * * * *\": minute is 60, but minutes run 0-59"),
            ("0 25 * * *", "schedule \"0 25 * * *\": hour is 25, but hours run 0-23"),
            ("0 0 0 * *", "schedule \"0 0 0 * *\": day of month is 0, but days of the month run 1-31"),
            ("0 0 32 * *", "schedule \"0 0 32 * *\": day of month is 32, but days of the month run 1-31"),
            ("0 0 * 13 *", "schedule \"0 0 * 13 *\": month is 13, but months run 1-12 (or jan-dec)"),
            ("0 0 * 0 *", "schedule \"0 0 * 0 *\": month is 0, but months run 1-12 (or jan-dec)"),
            (
                "0 0 * * 8",
                "schedule \"0 0 * * 8\": day of week is 8, but days of the week run 0-7 (0 and 7 are Sunday, or sun-sat)",
            ),
        ] {
            assert_eq!(refusal(expr), expect);
        }
        for ok in ["59 23 31 12 7", "0 0 1 1 0", "*/5 9-17 1,15 jan-jun mon-fri", "0 9 * * 1-7"] {
            Schedule::parse(ok, "UTC").unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn ranges_and_steps_are_checked_too() {
        assert_eq!(refusal("5-70 * * * *"), "schedule \"5-70 * * * *\": minute is 70, but minutes run 0-59");
        assert_eq!(refusal("*/0 * * * *"), "schedule \"*/0 * * * *\": minute step is 0, but a step runs 1-59");
        assert_eq!(refusal("0 */24 * * *"), "schedule \"0 */24 * * *\": hour step is 24, but a step runs 1-23");
        assert_eq!(refusal("*/x * * * *"), "schedule \"*/x * * * *\": minute step \"x\" is not a number");
        assert_eq!(
            refusal("0 9 * * 5-1"),
            "schedule \"0 9 * * 5-1\": day of week range 5-1 runs backwards: write the smaller end first"
        );
        assert_eq!(refusal("0 0-30/5 * * *"), "schedule \"0 0-30/5 * * *\": hour is 30, but hours run 0-23");
        assert!(
            refusal("0 0 * foo *")
                .starts_with("schedule \"0 0 * foo *\": the month field has \"foo\", which crontab does not accept")
        );
        assert!(refusal("0 0 * * mon-xyz").contains("the day of week field has \"xyz\""));
    }

    #[test]
    fn what_croner_refuses_is_said_in_our_words() {
        let said = unreadable("0 0 * * *").to_string();
        assert!(
            said.starts_with("schedule \"0 0 * * *\": it cannot be read as a schedule: write five fields"),
            "{said}"
        );
        for allowed in ["@hourly", "minutes run 0-59", "hours run 0-23", "months run 1-12", "days of the week run 0-7"]
        {
            assert!(said.contains(allowed), "{allowed} in {said}");
        }
        assert!(!said.contains("Component") && !said.contains("error"), "{said}");
        // Whatever reaches croner is worded by us, whether it takes it or not.
        for expr in ["0 0 31 2 *", "0 0 30 2 *", "1-1 * * * *", "0 0 1-31/31 * *", "0-0/59 * * * 0,7"] {
            if let Err(e) = Schedule::parse(expr, "UTC") {
                let said = e.to_string();
                assert!(said.starts_with(&format!("schedule {expr:?}: ")), "{said}");
                assert!(!said.contains("Component") && !said.contains("out of bounds"), "{said}");
            }
        }
    }

    #[test]
    fn a_schedule_no_date_matches_says_so() {
        let s = Schedule::parse("0 0 30 2 *", "UTC").unwrap();
        let said = s.next_after(utc(2026, 1, 1, 0, 0)).unwrap_err().to_string();
        assert_eq!(
            said,
            "schedule \"0 0 30 2 *\" never comes due: no date has the day of month, month and day of week it names"
        );
    }

    #[test]
    fn wrong_field_counts_and_croner_extensions_are_refused() {
        for (expr, count) in [("* * * *", 4), ("* * * * * *", 6), ("", 0), ("0", 1)] {
            let err = refusal(expr);
            assert!(err.contains(&format!("it has {count} fields, but a schedule is five fields")), "{err}");
            assert!(err.contains("@hourly"), "{err}");
        }
        for (expr, field) in [
            ("0 0 L * *", "the day of month field has \"L\""),
            ("0 0 * * 1#2", "the day of week field has \"1#2\""),
            ("0 0 * * +1", "the day of week field has \"+1\""),
            ("0 0 ? * *", "the day of month field has \"?\""),
            ("0 0 1W * *", "the day of month field has \"1W\""),
        ] {
            let err = refusal(expr);
            assert!(err.contains(field) && err.contains("crontab does not accept"), "{expr}: {err}");
        }
        assert!(refusal("@often").starts_with("schedule \"@often\": @often is not a shorthand crontab knows"));
        assert!(Schedule::parse("@daily", "Mars/Olympus").unwrap_err().to_string().contains("unknown time zone"));
        assert_eq!(Schedule::parse("  0   9 * *  MON-FRI ", "UTC").unwrap().expr(), "0 9 * * MON-FRI");
    }
}
