-- A wait for room of an org whose sessions parked at limits inside it (reason
-- `member_limit`): the members (a JSON array of [dimension, id]) whose limits were spent,
-- so that the notifier ends the wait once none of them is (a limit raised or removed, or
-- its window reset). NULL for a wait on the org's own room.
ALTER TABLE room_waits ADD COLUMN members TEXT;
