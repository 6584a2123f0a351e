//! Rates kept in this replica's memory: a token bucket each, checked before anything is read or
//! written, so a flood costs the server nothing but the check. Each belongs to the service that
//! checks it: sends per endpoint and per account ([`SendRates`], messaging); every call per
//! credential and per account, and new sessions per machine ([`CallRates`], identity); console
//! sign-ins ([`SignInRates`], console).
//! The deliveries a send makes are known only once it is written: they are counted then, and the
//! account's next send waits while it is past its delivery rate.
//! An agent talks to one replica at a time; with several replicas, each allows the rate.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::domain::Result;
use crate::domain::caller::Caller;
use crate::domain::caller::Holder;
use crate::domain::ids::{AccountId, EndpointId, MachineId};
use crate::domain::limits::{self, Quotas};
use crate::domain::rate::{Bucket, Rate};

/// Buckets kept at most by one set; past it, full ones are forgotten (forgetting a full bucket
/// changes nothing).
const MAX_BUCKETS: usize = 100_000;

/// One set of buckets, each key at the rate `rate_of` gives it.
struct Buckets<K> {
    quotas: Quotas,
    rate_of: fn(&Quotas, &K) -> Rate,
    held: Mutex<HashMap<K, Bucket>>,
}

/// The buckets, locked, with what a rate check needs.
struct Held<'a, K> {
    buckets: MutexGuard<'a, HashMap<K, Bucket>>,
    now: Instant,
}

impl<K: Eq + Hash + Clone> Buckets<K> {
    fn new(quotas: Quotas, rate_of: fn(&Quotas, &K) -> Rate) -> Self {
        Self { quotas, rate_of, held: Mutex::default() }
    }

    /// The buckets, with room made when they are many.
    fn lock(&self) -> Held<'_, K> {
        let now = Instant::now();
        let mut buckets = self.held.lock().expect("rate buckets lock poisoned");
        if buckets.len() >= MAX_BUCKETS {
            let (quotas, rate_of) = (self.quotas, self.rate_of);
            buckets.retain(|key, bucket| !bucket.is_full(rate_of(&quotas, key), now));
        }
        Held { buckets, now }
    }
}

impl<K: Eq + Hash + Clone> Held<'_, K> {
    /// The bucket of `key`, full when it is new.
    fn bucket(&mut self, key: K, rate: Rate) -> &mut Bucket {
        let now = self.now;
        self.buckets.entry(key).or_insert_with(|| Bucket::full(rate, now))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum SendKey {
    Endpoint(EndpointId),
    Account(AccountId),
    Deliveries(AccountId),
}

/// Sends per endpoint and per account, and the deliveries an account's sends make.
pub struct SendRates {
    buckets: Buckets<SendKey>,
}

impl SendRates {
    pub fn new(quotas: Quotas) -> Self {
        let rate_of = |q: &Quotas, key: &SendKey| match key {
            SendKey::Endpoint(_) => q.endpoint_sends,
            SendKey::Account(_) => q.account_sends,
            SendKey::Deliveries(_) => q.account_deliveries,
        };
        Self { buckets: Buckets::new(quotas, rate_of) }
    }

    /// Takes one send from the caller's endpoint and account, or refuses it with when to retry;
    /// a refusal takes nothing.
    pub fn admit(&self, caller: &Caller) -> Result<()> {
        let q = self.buckets.quotas;
        let (endpoint_rate, account_rate, deliveries_rate) = (q.endpoint_sends, q.account_sends, q.account_deliveries);
        if endpoint_rate.is_unlimited() && account_rate.is_unlimited() && deliveries_rate.is_unlimited() {
            return Ok(());
        }
        let mut held = self.buckets.lock();
        let now = held.now;
        if let Err(wait) =
            held.bucket(SendKey::Deliveries(caller.account_id), deliveries_rate).ready(deliveries_rate, now)
        {
            return Err(limits::delivering_too_much(&caller.account, deliveries_rate, wait));
        }
        let endpoint = SendKey::Endpoint(caller.endpoint_id);
        if let Err(wait) = held.bucket(endpoint.clone(), endpoint_rate).take(endpoint_rate, now) {
            return Err(limits::sending_too_fast(&caller.address(), endpoint_rate, wait));
        }
        if let Err(wait) = held.bucket(SendKey::Account(caller.account_id), account_rate).take(account_rate, now) {
            held.bucket(endpoint, endpoint_rate).give_back(endpoint_rate);
            return Err(limits::sending_too_fast(&format!("account {}", caller.account), account_rate, wait));
        }
        Ok(())
    }

    /// Counts the deliveries a written send made against its account.
    pub fn delivered(&self, caller: &Caller, deliveries: usize) {
        let rate = self.buckets.quotas.account_deliveries;
        if rate.is_unlimited() || deliveries == 0 {
            return;
        }
        let mut held = self.buckets.lock();
        let now = held.now;
        held.bucket(SendKey::Deliveries(caller.account_id), rate).spend(rate, deliveries as f64, now);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum CallKey {
    /// Calls with one credential.
    Calls(Holder),
    /// Calls of one account's credentials.
    AccountCalls(AccountId),
    /// Sessions a machine opens.
    Hellos(MachineId),
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

/// Every call per credential and per account, and the sessions a machine opens.
pub struct CallRates {
    buckets: Buckets<CallKey>,
}

impl CallRates {
    pub fn new(quotas: Quotas) -> Self {
        let rate_of = |q: &Quotas, key: &CallKey| match key {
            CallKey::Calls(_) => q.credential_calls,
            CallKey::AccountCalls(_) => q.account_calls,
            CallKey::Hellos(_) => q.machine_hellos,
        };
        Self { buckets: Buckets::new(quotas, rate_of) }
    }

    /// Takes one call from the credential's and its account's call rates (and, for a `Hello`, from
    /// its machine's rate of new sessions), or refuses it with when to retry; a refusal takes
    /// nothing.
    pub fn admit(&self, call: &Call<'_>) -> Result<()> {
        let q = self.buckets.quotas;
        let mut held = self.buckets.lock();
        let now = held.now;
        let mut taken: Vec<(CallKey, Rate)> = Vec::with_capacity(3);
        let mut wanted = vec![
            (CallKey::Calls(call.holder.clone()), q.credential_calls, call.who.to_owned()),
            (CallKey::AccountCalls(call.account), q.account_calls, "the account".to_owned()),
        ];
        if let Some(machine) = call.opens_session {
            wanted.push((CallKey::Hellos(machine), q.machine_hellos, format!("{} (new sessions)", call.who)));
        }
        for (key, rate, who) in wanted {
            if let Err(wait) = held.bucket(key.clone(), rate).take(rate, now) {
                for (key, rate) in taken {
                    held.bucket(key, rate).give_back(rate);
                }
                return Err(limits::calling_too_fast(&who, rate, wait));
            }
            taken.push((key, rate));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum SignInKey {
    /// Failed console sign-ins from one address.
    Failed(IpAddr),
    /// Console sessions an account's people open.
    Sessions(AccountId),
}

/// Console sign-ins: failed ones per client address, sessions per account.
pub struct SignInRates {
    buckets: Buckets<SignInKey>,
}

impl SignInRates {
    pub fn new(quotas: Quotas) -> Self {
        let rate_of = |q: &Quotas, key: &SignInKey| match key {
            SignInKey::Failed(_) => q.failed_sign_ins,
            SignInKey::Sessions(_) => q.account_sign_ins,
        };
        Self { buckets: Buckets::new(quotas, rate_of) }
    }

    /// Whether `address` may try to sign in now: refused while its failed sign-ins are past their
    /// rate, with when to try again.
    pub fn may_sign_in(&self, address: IpAddr) -> Result<()> {
        let rate = self.buckets.quotas.failed_sign_ins;
        let mut held = self.buckets.lock();
        let now = held.now;
        held.bucket(SignInKey::Failed(address), rate)
            .ready(rate, now)
            .map_err(|wait| limits::signing_in_too_fast("too many failed sign-ins from your address", wait))
    }

    /// Counts a failed sign-in from `address`.
    pub fn failed(&self, address: IpAddr) {
        let rate = self.buckets.quotas.failed_sign_ins;
        let mut held = self.buckets.lock();
        let now = held.now;
        held.bucket(SignInKey::Failed(address), rate).spend(rate, 1.0, now);
    }

    /// Takes one console session from `account`'s rate.
    pub fn sign_in(&self, account: AccountId, name: &str) -> Result<()> {
        let rate = self.buckets.quotas.account_sign_ins;
        let mut held = self.buckets.lock();
        let now = held.now;
        held.bucket(SignInKey::Sessions(account), rate).take(rate, now).map_err(|wait| {
            limits::signing_in_too_fast(&format!("account {name} opened more console sessions than it may"), wait)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Error;
    use crate::domain::ids::AccountId;

    #[test]
    fn console_sessions_past_an_accounts_rate_are_refused_with_a_real_wait() {
        let rates = SignInRates::new(Quotas::default());
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
        let rates = SignInRates::new(Quotas::default());
        let (guesser, person): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for _ in 0..Quotas::default().failed_sign_ins.burst as usize {
            rates.may_sign_in(guesser).expect("within the address's burst");
            rates.failed(guesser);
        }
        let refused = rates.may_sign_in(guesser).unwrap_err().to_string();
        assert!(refused.starts_with("too many failed sign-ins from your address: try again in"), "{refused}");
        rates.may_sign_in(person).expect("another address is not held back");
    }
}
