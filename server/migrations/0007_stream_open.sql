-- A crashed agent's handle comes back within seconds. The endpoint's newest push stream is open while
-- stream_gen > stream_closed_gen: opening a stream bumps stream_gen, its close records its generation
-- here, a new claim starts with none open. A server that knows nothing of this column never moves it,
-- so its streams count as open and its endpoints stay under the presence lease alone, as before.
alter table endpoints
    add column stream_closed_gen bigint not null default 0,
    -- when the current session claimed the handle
    add column claimed_at timestamptz;
