-- The loop guard counts a pair answering each other whatever their threads, kept by the writers on
-- the recipient's row they update anyway: who last wrote to this inbox (an agent; a person's inbox
-- keeps none), how many turns the two have answered each other since the streak began, and when
-- it began. A message from X to Y goes on X's streak when the last to write to X was Y within the
-- sender's account's window; past the account's bound the writer refuses it (RLY04) and the send
-- pipeline holds it for a person. Ids are never reused, so no foreign key (and no check on every
-- send) keeps `loop_peer`.

alter table endpoints
    add column loop_peer bigint,
    add column loop_turns integer not null default 0,
    add column loop_since timestamptz;
