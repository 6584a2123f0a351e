-- A permission request keeps its deadlines, so whichever replica's scheduler finds it due hands it
-- to the human or refuses it, even when the call that asked is gone (a dropped connection, a
-- replica restarted). Requests of the previous release have none: they are read as due from
-- their creation with the default wait.
alter table approvals add column escalate_at timestamptz, add column expire_at timestamptz;
