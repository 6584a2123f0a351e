-- What the forge last said of a card's pull request and when it was asked, so a worker asks about
-- each open one now and then, a merged one moves its card to Done, and a closed one is noted.
alter table jobs add column pr_state text check (pr_state in ('open', 'merged', 'closed')),
                 add column pr_checked_at timestamptz;
