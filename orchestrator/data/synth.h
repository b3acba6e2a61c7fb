// `ablate data synth KIND --out DIR` (docs/data.md): synthetic tasks written as prepared data
// (PreparedWriter), with a manifest whose params record the task and every setting.
//
// Every sequence is one document of seq_len + 1 tokens that starts with BOS, so a training window
// of seq_len tokens at a document start sees [BOS, ...] and predicts the rest. Train and val come
// from two separately seeded streams (val is not a copy of train); the generators use
// std::mt19937_64 and distributions of our own, so a seed gives the same bytes on every platform.
//
// The tasks, each as the paper that defines it:
//   bigram-backcopy  Guo et al. 2024, "Active-Dormant Attention Heads" (arXiv 2410.13835), the
//                    Bigram-Backcopy task: a bigram chain estimated on --from; after a trigger, the
//                    next token copies the token before the trigger. Attention sinks form on it.
//   mqar             Arora et al. 2023, "Zoology" (arXiv 2312.04927), multi-query associative
//                    recall: key-value pairs, then queries of those keys, each followed by its
//                    value.
//   passkey          Mohtashami & Jaggi 2023, "Landmark Attention" (arXiv 2305.16300), the pass key
//                    retrieval test: filler text from --from, a fraction of documents carrying a
//                    pass key that the document repeats at its end.
// synth.cc says, per task, what follows the paper and its released code and what differs.
//
// Uses SentencePiece (through sentencepiece_tokenizer.h) to encode the pass key sentences of a
// SentencePiece-tokenized corpus: part of `ablate-data` only.
#ifndef ABLATE_ORCHESTRATOR_DATA_SYNTH_H_
#define ABLATE_ORCHESTRATOR_DATA_SYNTH_H_

#include <cstdint>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace ablate {

// Options of `ablate-data synth KIND --out DIR`; the flag of each field is named beside it.
struct SynthOptions {
  std::string kind;            // KIND: bigram-backcopy | mqar | passkey
  std::string out;             // --out: the prepared directory to write
  int64_t tokens = 1000000;    // --tokens: total tokens, about; tokens / (seq_len + 2) sequences
  uint64_t seed = 1234;        // --seed
  std::string from;            // --from: a prepared directory or a raw text file (bytes)
  int seq_len = 256;           // --seq-len: tokens after BOS in every sequence
  double val_fraction = 0.05;  // --val-fraction: of the sequences, written to val.bin
  bool force = false;  // --force: replace an existing OUT (only once the new one is complete)
  bool quiet = false;  // --quiet: no summary line on stderr
  // bigram-backcopy.
  int triggers = 3;  // --triggers: the K most frequent corpus tokens are triggers
  // mqar.
  int pairs = 16;         // --pairs: key-value pairs at the start of every sequence
  int queries = 16;       // --queries: keys queried later (<= pairs, each at most once)
  int64_t vocab = 0;      // --vocab: task ids; 0 = 8192 (Zoology's), or 2 * pairs if more
  double power_a = 0.01;  // --power-a: query-gap power law p(g) ~ g^(a-1) (Zoology's 0.01)
  // passkey.
  int key_digits = 5;     // --key-digits: digits of the random pass key
  double fraction = 0.5;  // --fraction: of the documents, those that carry a key
};

// Generates the task and writes it to options.out as prepared data (atomically: OUT appears only
// complete). Errors name what is wrong (an unknown KIND, a missing or unreadable --from, a
// sequence too short for the task, ...) and leave no OUT.
absl::Status Synthesize(const SynthOptions& options);

// Registers the "synth" subcommand of ablate-data with its flags. A failure is printed to stderr
// and ends the parse with CLI::RuntimeError(1).
void AddSynthCommand(CLI::App* app);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_DATA_SYNTH_H_
