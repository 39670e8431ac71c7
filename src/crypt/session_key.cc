#include "ckptfs/crypt/session_key.h"

#include "ckptfs/error.h"

namespace ckptfs::crypt {

namespace {

// Wiped when the process exits normally (Key's destructor); never written anywhere.
Key& slot() {
  static Key key;
  return key;
}

}  // namespace

void set_session_key(Key key) { slot() = std::move(key); }

const Key* session_key() { return slot().empty() ? nullptr : &slot(); }

Key session_key_for(const std::string& name) {
  const Key* key = session_key();
  if (key == nullptr)
    fail(
        "{}: byte offset 0: encrypted checkpoint; give its key with --dec-key-file FILE (raw "
        "key bytes, mode 600) or --dec-key-env NAME (hex)",
        name);
  return Key(key->bytes(), "the session key");
}

}  // namespace ckptfs::crypt
