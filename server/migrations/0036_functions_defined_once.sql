-- From this release every function's current body lives in one file under functions/, which the
-- migrator applies after the numbered migrations. Bodies written in earlier migrations stay as they
-- were released; a fresh database gets them and then the files' bodies. What no release since
-- migration 30 calls is dropped here.

-- contract: relay_send_batch was replaced by relay_write_send_set and relay_write_sends in migration 22 and no release since calls it
drop function relay_send_batch(jsonb, integer, bigint);
-- contract: relay_write_send was replaced by relay_write_send_numbered in migration 30 and no release since calls it
drop function relay_write_send(relay_outgoing, integer, bigint);
-- contract: relay_write_sends was replaced by relay_write_sends_numbered in migration 30 and no release since calls it
drop function relay_write_sends(relay_outgoing[], integer, bigint);

-- Migration 25 announced a console session's end on `relay_account`; pages listen on
-- `relay_console` since migration 28, so these announcements wake nobody.
-- contract: pages of every release since migration 28 hear a session's end on relay_console
drop trigger console_sessions_ended on console_sessions;
-- contract: pages of every release since migration 28 hear a human revoked on relay_console
drop trigger humans_shown on humans;
-- contract: its only trigger, console_sessions_ended, is dropped above
drop function relay_console_session_ended();
