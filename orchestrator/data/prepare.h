// `ablate-data prepare INPUT... --out DIR` (docs/data.md): raw text to a prepared directory of
// tokens (prepared_writer.h), with a tokenizer that is bytes, a SentencePiece BPE or unigram model
// trained on the corpus, or a SentencePiece .model given.
//
// Two streaming passes over the inputs, so memory stays bounded whatever the corpus size:
//  1. reads every input once: hashes it, checks its UTF-8, counts its documents and draws the
//     tokenizer's training sentences (a seeded reservoir of at most max_sentences lines);
//  2. reads it again and encodes documents on `threads` threads, written in corpus order, each to
//     train.bin or val.bin by a seeded choice of whole documents.
// The whole-corpus state is one bit per document (its split). A document is read in pieces of
// whole lines of at most ~1 MiB and encoded a line at a time, so a single huge file never sits in
// memory (a JSON Lines line is parsed whole, so it must fit).
//
// Errors name the input and the line or byte offset; on any error no DIR is left (nor a partial
// one). Not thread-safe: one Prepare() at a time in a process (SentencePiece's log level is
// process-wide).
#ifndef ABLATE_ORCHESTRATOR_DATA_PREPARE_H_
#define ABLATE_ORCHESTRATOR_DATA_PREPARE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "common/token_files.h"

namespace ablate {

struct PrepareOptions {
  // Files and directories (searched recursively, sorted by path, hidden entries skipped). A
  // `.jsonl` file holds one JSON object per line; any other file is text.
  std::vector<std::string> inputs;
  std::string out;  // the prepared directory to create
  // "bytes" (ids 0-255, eod 256, bos 257), "bpe" or "unigram" (SentencePiece, trained here), or
  // the path of an existing SentencePiece .model file.
  std::string tokenizer = "bytes";
  int64_t vocab_size = 8192;   // for bpe and unigram
  std::string field = "text";  // the JSON Lines field holding a document
  // How a text file splits into documents: "file" (the whole file), "line" (each non-empty line),
  // "blank" (runs of lines separated by blank lines).
  std::string docs = "file";
  double val_fraction = 0.05;           // of documents, at least one, to val.bin
  uint64_t seed = 1234;                 // the validation choice and the training sample
  int64_t max_sentences = 300000;       // lines sampled to train bpe/unigram
  int threads = 0;                      // encoding (and training) threads; 0: the machine's cores
  std::string invalid_utf8 = "refuse";  // or "replace" (each bad sequence becomes U+FFFD)
  bool force = false;                   // replace an existing DIR (once the new one is complete)
  // Progress on stderr: a bar when stderr is a terminal; none when false.
  bool progress = true;
};

// Prepares options.out and returns its manifest (as written). Errors: InvalidArgument for bad
// options or bad input (naming the file and line or byte offset), NotFound for a missing input,
// AlreadyExists for an existing DIR without `force`.
absl::StatusOr<DataManifest> Prepare(const PrepareOptions& options);

// Registers the "prepare" subcommand of ablate-data: errors go to stderr and exit with code 1; a
// one-line summary goes to stderr unless --quiet.
void AddPrepareCommand(CLI::App* app);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_DATA_PREPARE_H_
