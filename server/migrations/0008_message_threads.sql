-- A send that continues a thread checks that the sender took part in it.
create index messages_thread on messages (thread);
