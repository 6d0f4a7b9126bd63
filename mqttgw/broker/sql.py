"""
Every SQL statement of the durable store, in one place: the schema and
its upgrades, what start-up reads, what the writer thread executes, and
the meta rows that say which database it is and how far it was committed.
"""

# 2: sessions.last_seen; 3: MQTT 5.0's session expiry, and message
# properties and expiry; 4: sessions.sent_seq; 5: sessions.owner; 6:
# topic_ids (older stores are upgraded in place).
SCHEMA_VERSION = 6
# The oldest version a store that cannot be written may be read at: what
# came after it only adds tables, read as empty (a gateway upgraded on a
# full disk still starts, degraded, as on any full disk).
READABLE_FROM = 5

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS retained (
    topic TEXT PRIMARY KEY, payload BLOB NOT NULL, qos INTEGER NOT NULL,
    properties BLOB, expiry REAL);
CREATE TABLE IF NOT EXISTS sessions (
    client_id TEXT PRIMARY KEY, last_seen REAL, expiry_interval INTEGER,
    sent_seq INTEGER, owner TEXT);
CREATE TABLE IF NOT EXISTS subscriptions (
    client_id TEXT NOT NULL, topic_filter TEXT NOT NULL, qos INTEGER NOT NULL,
    PRIMARY KEY (client_id, topic_filter));
CREATE TABLE IF NOT EXISTS deliveries (
    client_id TEXT NOT NULL, seq INTEGER NOT NULL,
    topic TEXT NOT NULL, payload BLOB NOT NULL, qos INTEGER NOT NULL,
    retain INTEGER NOT NULL, message_id INTEGER, state INTEGER NOT NULL,
    properties BLOB, expiry REAL,
    PRIMARY KEY (client_id, seq));
CREATE TABLE IF NOT EXISTS awaiting_pubrel (
    client_id TEXT NOT NULL, message_id INTEGER NOT NULL,
    PRIMARY KEY (client_id, message_id));
CREATE TABLE IF NOT EXISTS topic_ids (
    client_id TEXT NOT NULL, topic_id INTEGER NOT NULL, topic TEXT NOT NULL,
    PRIMARY KEY (client_id, topic_id));
"""

# Columns added since version 1 (a table made new already has them).
_ADDED_COLUMNS = [
    ("sessions", "last_seen", "REAL"),
    ("sessions", "expiry_interval", "INTEGER"),
    ("retained", "properties", "BLOB"),
    ("retained", "expiry", "REAL"),
    ("deliveries", "properties", "BLOB"),
    ("deliveries", "expiry", "REAL"),
    ("sessions", "sent_seq", "INTEGER"),
    # NULL in a session stored before: its first login claims it.
    ("sessions", "owner", "TEXT"),
]


def upgrade(db):
    """An older store's tables given the columns added since."""
    for table, column, type_ in _ADDED_COLUMNS:
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in columns:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {type_}")


# Opening
JOURNAL_WAL = "PRAGMA journal_mode=WAL"
SYNCHRONOUS = "PRAGMA synchronous={}"  # with DURABILITY's value
QUICK_CHECK = "PRAGMA quick_check"
CHECKPOINT = "PRAGMA wal_checkpoint(TRUNCATE)"

# The meta rows: schema version, the database's id, commits.
SCHEMA_READ = "SELECT value FROM meta WHERE key='schema'"
SCHEMA_ADD = "INSERT INTO meta VALUES ('schema', ?)"
SCHEMA_SET = "UPDATE meta SET value = ? WHERE key = 'schema'"
IDENTITY_READ = "SELECT key, value FROM meta WHERE key IN ('id', 'commits')"
META_ADD = "INSERT INTO meta VALUES (?, ?)"
COMMITS_READ = "SELECT value FROM meta WHERE key = 'commits'"
COMMITS_SET = "UPDATE meta SET value = ? WHERE key = 'commits'"


def count(table):
    """The rows of ``table`` (one of the schema's), for a log line."""
    return f"SELECT count(*) FROM {table}"


# Start-up: everything stored.
RETAINED_ALL = "SELECT topic, payload, qos, properties, expiry FROM retained"
SESSIONS_ALL = "SELECT client_id, last_seen, expiry_interval, sent_seq, owner FROM sessions"
SUBSCRIPTIONS_ALL = "SELECT client_id, topic_filter, qos FROM subscriptions"
DELIVERIES_ALL = (
    "SELECT client_id, seq, topic, payload, qos, retain, message_id, state,"
    " properties, expiry FROM deliveries ORDER BY client_id, seq"
)
PUBRELS_ALL = "SELECT client_id, message_id FROM awaiting_pubrel"
TOPIC_IDS_ALL = "SELECT client_id, topic_id, topic FROM topic_ids"
TABLE_EXISTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"

# Writes: sessions and subscriptions, executed in order (writes.SQL).
SESSION_ADD = (
    "INSERT OR REPLACE INTO sessions (client_id, last_seen, expiry_interval, owner)"
    " VALUES (?, NULL, ?, ?)"
)
SESSION_OWNER = "UPDATE sessions SET owner = ? WHERE client_id = ?"
SESSION_EXPIRY = "UPDATE sessions SET expiry_interval = ? WHERE client_id = ?"
SESSION_TOUCH = "UPDATE sessions SET last_seen = ? WHERE client_id = ?"
SUBSCRIPTION_ADD = "INSERT OR REPLACE INTO subscriptions VALUES (?, ?, ?)"
SUBSCRIPTION_DELETE = "DELETE FROM subscriptions WHERE client_id = ? AND topic_filter = ?"
# A session's topic ids: an MQTT-SN client's registrations (its normal ids).
TOPIC_ID_ADD = "INSERT OR REPLACE INTO topic_ids VALUES (?, ?, ?)"
TOPIC_ID_DELETE = "DELETE FROM topic_ids WHERE client_id = ? AND topic_id = ?"
TOPIC_IDS_DELETE = "DELETE FROM topic_ids WHERE client_id = ?"

# Writes a batch folds (writes.Compaction).
DELIVERY_ADD = "INSERT INTO deliveries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
DELIVERY_UPDATE = "UPDATE deliveries SET message_id = ?, state = ? WHERE client_id = ? AND seq = ?"
DELIVERIES_DELETE = "DELETE FROM deliveries WHERE client_id = ? AND seq BETWEEN ? AND ?"
SESSION_SENT = "UPDATE sessions SET sent_seq = max(coalesce(sent_seq, 0), ?) WHERE client_id = ?"
PUBREL_ADD = "INSERT OR IGNORE INTO awaiting_pubrel VALUES (?, ?)"
PUBREL_DELETE = "DELETE FROM awaiting_pubrel WHERE client_id = ? AND message_id = ?"
RETAINED_SET = "INSERT OR REPLACE INTO retained VALUES (?, ?, ?, ?, ?)"
RETAINED_DELETE = "DELETE FROM retained WHERE topic = ?"
SESSION_DROP = [
    f"DELETE FROM {table} WHERE client_id = ?"
    for table in ("sessions", "subscriptions", "deliveries", "awaiting_pubrel", "topic_ids")
]
