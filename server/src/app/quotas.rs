//! Rates kept in this replica's memory: a token bucket each, checked before anything is read or
//! written, so a flood costs the server nothing but the check. Sends per endpoint and per account
//! ([`SendRates`]); every call per credential and per account, and new sessions per machine
//! ([`App::admit_call`]).
//! The deliveries a send makes are known only once it is written: they are counted then, and the
//! account's next send waits while it is past its delivery rate.
//! An agent talks to one replica at a time; with several replicas, each allows the rate.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

use crate::domain::Result;
use crate::domain::caller::Caller;
use crate::domain::caller::Holder;
use crate::domain::ids::{AccountId, EndpointId, MachineId};
use crate::domain::limits::{self, Quotas};
use crate::domain::rate::{Bucket, Rate};

/// Buckets kept at most; past it, full ones are forgotten (forgetting a full bucket changes nothing).
const MAX_BUCKETS: usize = 100_000;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Endpoint(EndpointId),
    Account(AccountId),
    Deliveries(AccountId),
    /// Calls with one credential.
    Calls(Holder),
    /// Calls of one account's credentials.
    AccountCalls(AccountId),
    /// Sessions a machine opens.
    Hellos(MachineId),
    /// Failed console sign-ins from one address.
    FailedSignIns(IpAddr),
    /// Console sessions an account's people open.
    SignIns(AccountId),
}

pub struct SendRates {
    quotas: Quotas,
    buckets: Mutex<HashMap<Key, Bucket>>,
}

impl SendRates {
    pub fn new(quotas: Quotas) -> Self {
        Self { quotas, buckets: Mutex::default() }
    }

    /// Takes one send from the caller's endpoint and account, or refuses it with when to retry;
    /// a refusal takes nothing.
    pub fn admit(&self, caller: &Caller) -> Result<()> {
        let (endpoint_rate, account_rate) = (self.quotas.endpoint_sends, self.quotas.account_sends);
        let deliveries_rate = self.quotas.account_deliveries;
        if endpoint_rate.is_unlimited() && account_rate.is_unlimited() && deliveries_rate.is_unlimited() {
            return Ok(());
        }
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("send rates lock poisoned");
        if buckets.len() >= MAX_BUCKETS {
            let quotas = self.quotas;
            buckets.retain(|key, bucket| !bucket.is_full(rate_of(&quotas, key), now));
        }
        let deliveries =
            buckets.entry(Key::Deliveries(caller.account_id)).or_insert_with(|| Bucket::full(deliveries_rate, now));
        if let Err(wait) = deliveries.ready(deliveries_rate, now) {
            return Err(limits::delivering_too_much(&caller.account, deliveries_rate, wait));
        }
        let endpoint = Key::Endpoint(caller.endpoint_id);
        let mine = buckets.entry(endpoint.clone()).or_insert_with(|| Bucket::full(endpoint_rate, now));
        if let Err(wait) = mine.take(endpoint_rate, now) {
            return Err(limits::sending_too_fast(&caller.address(), endpoint_rate, wait));
        }
        let account = buckets.entry(Key::Account(caller.account_id)).or_insert_with(|| Bucket::full(account_rate, now));
        if let Err(wait) = account.take(account_rate, now) {
            if let Some(mine) = buckets.get_mut(&endpoint) {
                mine.give_back(endpoint_rate);
            }
            return Err(limits::sending_too_fast(&format!("account {}", caller.account), account_rate, wait));
        }
        Ok(())
    }

    /// Counts the deliveries a written send made against its account.
    pub fn delivered(&self, caller: &Caller, deliveries: usize) {
        let rate = self.quotas.account_deliveries;
        if rate.is_unlimited() || deliveries == 0 {
            return;
        }
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("send rates lock poisoned");
        let bucket = buckets.entry(Key::Deliveries(caller.account_id)).or_insert_with(|| Bucket::full(rate, now));
        bucket.spend(rate, deliveries as f64, now);
    }
}

fn rate_of(quotas: &Quotas, key: &Key) -> Rate {
    match key {
        Key::Endpoint(_) => quotas.endpoint_sends,
        Key::Account(_) => quotas.account_sends,
        Key::Deliveries(_) => quotas.account_deliveries,
        Key::Calls(_) => quotas.credential_calls,
        Key::AccountCalls(_) => quotas.account_calls,
        Key::Hellos(_) => quotas.machine_hellos,
        Key::FailedSignIns(_) => quotas.failed_sign_ins,
        Key::SignIns(_) => quotas.account_sign_ins,
    }
}

/// A call admission counts: whose credential, which account, and whether it opens a session of a
/// machine (`Hello` with a machine's or a card's token).
pub struct Call<'a> {
    pub account: AccountId,
    pub holder: Holder,
    /// The credential as a refusal names it.
    pub who: &'a str,
    pub opens_session: Option<MachineId>,
}

impl SendRates {
    /// Whether `address` may try to sign in now: refused while its failed sign-ins are past their
    /// rate, with when to try again.
    pub fn may_sign_in(&self, address: IpAddr) -> Result<()> {
        let rate = self.quotas.failed_sign_ins;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("send rates lock poisoned");
        let bucket = buckets.entry(Key::FailedSignIns(address)).or_insert_with(|| Bucket::full(rate, now));
        bucket
            .ready(rate, now)
            .map_err(|wait| limits::signing_in_too_fast("too many failed sign-ins from your address", wait))
    }

    /// Counts a failed sign-in from `address`.
    pub fn failed_sign_in(&self, address: IpAddr) {
        let rate = self.quotas.failed_sign_ins;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("send rates lock poisoned");
        buckets.entry(Key::FailedSignIns(address)).or_insert_with(|| Bucket::full(rate, now)).spend(rate, 1.0, now);
    }

    /// Takes one console session from `account`'s rate.
    pub fn sign_in(&self, account: AccountId, name: &str) -> Result<()> {
        let rate = self.quotas.account_sign_ins;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("send rates lock poisoned");
        let bucket = buckets.entry(Key::SignIns(account)).or_insert_with(|| Bucket::full(rate, now));
        bucket.take(rate, now).map_err(|wait| {
            limits::signing_in_too_fast(&format!("account {name} opened more console sessions than it may"), wait)
        })
    }

    /// Takes one call from the credential's and its account's call rates (and, for a `Hello`, from
    /// its machine's rate of new sessions), or refuses it with when to retry; a refusal takes
    /// nothing.
    pub fn admit_call(&self, call: &Call<'_>) -> Result<()> {
        let q = self.quotas;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("send rates lock poisoned");
        if buckets.len() >= MAX_BUCKETS {
            buckets.retain(|key, bucket| !bucket.is_full(rate_of(&q, key), now));
        }
        let mut taken: Vec<(Key, Rate)> = Vec::with_capacity(3);
        let mut wanted = vec![
            (Key::Calls(call.holder.clone()), q.credential_calls, call.who.to_owned()),
            (Key::AccountCalls(call.account), q.account_calls, "the account".to_owned()),
        ];
        if let Some(machine) = call.opens_session {
            wanted.push((Key::Hellos(machine), q.machine_hellos, format!("{} (new sessions)", call.who)));
        }
        for (key, rate, who) in wanted {
            let bucket = buckets.entry(key.clone()).or_insert_with(|| Bucket::full(rate, now));
            if let Err(wait) = bucket.take(rate, now) {
                for (key, rate) in taken {
                    if let Some(bucket) = buckets.get_mut(&key) {
                        bucket.give_back(rate);
                    }
                }
                return Err(limits::calling_too_fast(&who, rate, wait));
            }
            taken.push((key, rate));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Error;
    use crate::domain::ids::AccountId;

    #[test]
    fn console_sessions_past_an_accounts_rate_are_refused_with_a_real_wait() {
        let rates = SendRates::new(Quotas::default());
        let burst = Quotas::default().account_sign_ins.burst as usize;
        for _ in 0..burst {
            rates.sign_in(AccountId(1), "acme").expect("within the account's burst");
        }
        let refused = rates.sign_in(AccountId(1), "acme").unwrap_err();
        let Error::Throttled { message, retry_after } = refused else { panic!("{refused:?}") };
        assert_eq!(message, "account acme opened more console sessions than it may: try again in 2 s");
        assert!(retry_after > std::time::Duration::ZERO);
        rates.sign_in(AccountId(2), "globex").expect("another account signs in");
    }

    #[test]
    fn failed_sign_ins_hold_back_their_address_alone() {
        let rates = SendRates::new(Quotas::default());
        let (guesser, person): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for _ in 0..Quotas::default().failed_sign_ins.burst as usize {
            rates.may_sign_in(guesser).expect("within the address's burst");
            rates.failed_sign_in(guesser);
        }
        let refused = rates.may_sign_in(guesser).unwrap_err().to_string();
        assert!(refused.starts_with("too many failed sign-ins from your address: try again in"), "{refused}");
        rates.may_sign_in(person).expect("another address is not held back");
    }
}
