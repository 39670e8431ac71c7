// The one decryption key of a command (--dec-key-file or --dec-key-env), for every encrypted
// source it reads: the encrypted-checkpoint reader scans with it and the read path decrypts with
// it. A process serves one user's checkpoint, so one key; a source that needs another is refused
// at mount (its blocks do not decrypt).
//
// Thread-safety: set_session_key is called once by the command, before any source is scanned
// and before any other thread starts; session_key() may then be called from any thread.
#pragma once

#include <memory>

#include "ckptfs/crypt/key.h"

namespace ckptfs::crypt {

void set_session_key(Key key);
// The key given, or null when none was (an encrypted source is then refused, naming the option).
const Key* session_key();
// A copy of the session key for one DecryptedStream (which owns and wipes its key). Throws Error
// when none was given, naming `name` and the options that give one.
Key session_key_for(const std::string& name);

}  // namespace ckptfs::crypt
