//! Ids as Postgres reads and writes them: row ids as `bigint`, text ids as `text`, token hashes as
//! `bytea` (and arrays of each). Encodings only: the store owns every statement.

use bytes::BytesMut;
use postgres_types::{FromSql, IsNull, ToSql, Type, accepts, to_sql_checked};

use crate::ids::{
    AccountId, ApprovalId, CapId, ClaimId, EndpointId, GroupId, HoldId, JobId, MachineId, MessageId, ReplicaId, RepoId,
    ScheduleId, Seq, TokenHash,
};

type BoxError = Box<dyn std::error::Error + Sync + Send>;

macro_rules! bigint_id {
    ($name:ident) => {
        impl ToSql for $name {
            fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
                self.0.to_sql(ty, out)
            }

            accepts!(INT8);
            to_sql_checked!();
        }

        impl<'a> FromSql<'a> for $name {
            fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
                i64::from_sql(ty, raw).map(Self)
            }

            accepts!(INT8);
        }
    };
}

bigint_id!(EndpointId);
bigint_id!(AccountId);
bigint_id!(MachineId);
bigint_id!(GroupId);
bigint_id!(RepoId);
bigint_id!(ReplicaId);
bigint_id!(CapId);
bigint_id!(ClaimId);
bigint_id!(Seq);

macro_rules! text_id {
    ($name:ident) => {
        impl ToSql for $name {
            fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
                self.as_str().to_sql(ty, out)
            }

            accepts!(TEXT, VARCHAR);
            to_sql_checked!();
        }

        impl<'a> FromSql<'a> for $name {
            fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
                String::from_sql(ty, raw).map(Self::new)
            }

            accepts!(TEXT, VARCHAR);
        }
    };
}

text_id!(MessageId);
text_id!(JobId);
text_id!(ScheduleId);
text_id!(ApprovalId);
text_id!(HoldId);

impl ToSql for TokenHash {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        self.as_bytes().to_sql(ty, out)
    }

    accepts!(BYTEA);
    to_sql_checked!();
}

impl<'a> FromSql<'a> for TokenHash {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Vec::<u8>::from_sql(ty, raw).map(Self::from_stored)
    }

    accepts!(BYTEA);
}
