-- A machine's token reissued is announced on `relay_control` as a revocation is, so replicas that
-- authenticate machine tokens from memory forget the old one at once.

create trigger machines_token_control after update of token_hash on machines
    for each row when (old.token_hash is distinct from new.token_hash)
    execute function relay_machine_changed();
