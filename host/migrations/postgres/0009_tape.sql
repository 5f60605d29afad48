-- What a durable node read of its clocks and random seed before each call
-- or wait (a JSON list, or NULL when it read nothing): a run of the node
-- after a wait or a crash reads the same.
ALTER TABLE calls ADD COLUMN tape TEXT;
