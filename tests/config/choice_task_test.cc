// multiple_choice task files (config/choice_task.h): real lm-evaluation-harness v0.4 tasks (piqa,
// arc_easy, arc_challenge, sciq, openbookqa, boolq, hellaswag) rewritten for local JSON data and
// read to the exact contexts, choices and answers; the Jinja subset; the fingerprint; limit and
// chance; every refused setting and bad document named by FILE:LINE and field.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/choice_task.h"
#include "config/model_config.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;

// The metric entries every real task above lists.
constexpr char kMetrics[] = R"(metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
)";

// 1-based line of the first line of `text` holding `needle` (0 when none): the tests name the
// line an error must point at by its content, not by a count that drifts with the text.
int LineOf(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  if (at == std::string::npos) return 0;
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + at, '\n'));
}

class ChoiceTaskTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::FreshTestDir("choice_task_test"); }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `text` to DIR/name; returns the path.
  std::string Write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
    return path.string();
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  ChoiceTask Load(const std::string& name, int limit = 0) {
    absl::StatusOr<ChoiceTask> task = LoadChoiceTask(Path(name), limit);
    EXPECT_TRUE(task.ok()) << task.status();
    return task.ok() ? *std::move(task) : ChoiceTask();
  }

  // The error of loading `name`, which must be InvalidArgument.
  std::string Error(const std::string& name, int limit = 0) {
    absl::StatusOr<ChoiceTask> task = LoadChoiceTask(Path(name), limit);
    EXPECT_FALSE(task.ok());
    if (task.ok()) return "";
    EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument) << task.status();
    const std::string message(task.status().message());
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
    return message;
  }

  // A small valid task in piqa's style, its keys in this order, each replaced by `overrides`
  // (an empty value drops the key), then `extra` lines; and its data (two documents).
  std::string PiqaLike(const std::vector<std::pair<std::string, std::string>>& overrides = {},
                       const std::string& extra = "") {
    std::vector<std::pair<std::string, std::string>> keys = {
        {"task", "piqa"},
        {"dataset_path", "json"},
        {"dataset_name", "null"},
        {"dataset_kwargs", "{data_files: {validation: piqa_valid.jsonl}}"},
        {"output_type", "multiple_choice"},
        {"training_split", "train"},
        {"validation_split", "validation"},
        {"doc_to_text", R"("Question: {{goal}}\nAnswer:")"},
        {"doc_to_target", "label"},
        {"doc_to_choice", R"("{{[sol1, sol2]}}")"},
    };
    std::string text;
    for (auto& [key, value] : keys) {
      for (const auto& [k, v] : overrides) {
        if (k == key) value = v;
      }
      if (!value.empty()) absl::StrAppend(&text, key, ": ", value, "\n");
    }
    for (const auto& [k, v] : overrides) {
      bool known = false;
      for (const auto& [key, value] : keys) known = known || key == k;
      if (!known) absl::StrAppend(&text, k, ": ", v, "\n");
    }
    absl::StrAppend(&text, extra);
    Write(
        "piqa_valid.jsonl",
        R"({"goal": "How do I boil an egg?", "sol1": "Put it in boiling water.", "sol2": "Put it in the freezer.", "label": 0}
{"goal": "How do I dry wet shoes?", "sol1": "Put them in the fridge.", "sol2": "Stuff them with newspaper.", "label": 1}
)");
    return text;
  }

  fs::path dir_;
};

#define EXPECT_HAS(message, text)                    \
  EXPECT_NE((message).find(text), std::string::npos) \
      << "expected \"" << (text) << "\" in: " << (message)

TEST_F(ChoiceTaskTest, Piqa) {
  Write("piqa.yaml", absl::StrCat(R"(task: piqa
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    train: piqa_train.jsonl
    validation: piqa_valid.jsonl
output_type: multiple_choice
training_split: train
validation_split: validation
test_split: null
doc_to_text: "Question: {{goal}}\nAnswer:"
doc_to_target: label
doc_to_choice: "{{[sol1, sol2]}}"
should_decontaminate: true
doc_to_decontamination_query: goal
)",
                                  kMetrics));
  PiqaLike();  // the data
  const ChoiceTask task = Load("piqa.yaml");
  EXPECT_EQ(task.name, "piqa");
  EXPECT_EQ(task.file, Path("piqa.yaml"));
  EXPECT_EQ(task.target_delimiter, " ");
  // test_split: null, so the validation split; the train file is never read (it is not there).
  EXPECT_EQ(task.data_files, (std::vector<std::string>{Path("piqa_valid.jsonl")}));
  ASSERT_EQ(task.items.size(), 2u);
  EXPECT_EQ(task.items[0].context, "Question: How do I boil an egg?\nAnswer:");
  EXPECT_EQ(task.items[0].choices,
            (std::vector<std::string>{"Put it in boiling water.", "Put it in the freezer."}));
  EXPECT_EQ(task.items[0].gold, 0);
  EXPECT_EQ(task.items[1].context, "Question: How do I dry wet shoes?\nAnswer:");
  EXPECT_EQ(task.items[1].choices,
            (std::vector<std::string>{"Put them in the fridge.", "Stuff them with newspaper."}));
  EXPECT_EQ(task.items[1].gold, 1);
  EXPECT_DOUBLE_EQ(task.chance, 0.5);
  EXPECT_EQ(task.fingerprint.size(), 16u);
  EXPECT_EQ(task.fingerprint.find_first_not_of("0123456789abcdef"), std::string::npos);
}

constexpr char kArcEasy[] = R"(tag:
  - ai2_arc
task: arc_easy
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: arc_easy_test.jsonl
output_type: multiple_choice
training_split: train
validation_split: validation
test_split: test
doc_to_text: "Question: {{question}}\nAnswer:"
doc_to_target: "{{choices.label.index(answerKey)}}"
doc_to_choice: "{{choices.text}}"
should_decontaminate: true
doc_to_decontamination_query: "Question: {{question}}\nAnswer:"
)";

TEST_F(ChoiceTaskTest, ArcEasyAndArcChallengeByInclude) {
  Write("arc_easy.yaml", absl::StrCat(kArcEasy, kMetrics));
  Write(
      "arc_easy_test.jsonl",
      R"({"id": "Mercury_7175875", "question": "Which is the most likely effect of a faster rotation of a planet?", "choices": {"text": ["Planetary density will decrease.", "Planetary years will become longer.", "Planetary days will become shorter.", "Planetary gravity will become stronger."], "label": ["A", "B", "C", "D"]}, "answerKey": "C"}
{"id": "NYSEDREGENTS_2015_4_9", "question": "Which tool measures mass?", "choices": {"text": ["ruler", "balance", "thermometer"], "label": ["1", "2", "3"]}, "answerKey": "2"}
)");
  // arc_challenge.yaml of the harness: the easy task's file with another name and data.
  Write("arc_challenge.yaml", R"(include: arc_easy.yaml
task: arc_challenge
dataset_kwargs:
  data_files:
    test: challenge/test.jsonl
)");
  Write(
      "challenge/test.jsonl",
      R"({"id": "Mercury_SC_415702", "question": "George wants to warm his hands quickly by rubbing them. Which skin surface will produce the most heat?", "choices": {"text": ["dry palms", "wet palms", "palms covered with oil", "palms covered with lotion"], "label": ["A", "B", "C", "D"]}, "answerKey": "A"}
)");

  const ChoiceTask easy = Load("arc_easy.yaml");
  EXPECT_EQ(easy.name, "arc_easy");
  ASSERT_EQ(easy.items.size(), 2u);
  EXPECT_EQ(easy.items[0].context,
            "Question: Which is the most likely effect of a faster rotation of a planet?\nAnswer:");
  EXPECT_EQ(easy.items[0].choices,
            (std::vector<std::string>{
                "Planetary density will decrease.", "Planetary years will become longer.",
                "Planetary days will become shorter.", "Planetary gravity will become stronger."}));
  EXPECT_EQ(easy.items[0].gold, 2);
  // Labels "1", "2", "3": the index of "2" in them, not the digits as an index.
  EXPECT_EQ(easy.items[1].choices, (std::vector<std::string>{"ruler", "balance", "thermometer"}));
  EXPECT_EQ(easy.items[1].gold, 1);
  EXPECT_DOUBLE_EQ(easy.chance, (1.0 / 4 + 1.0 / 3) / 2);

  const ChoiceTask challenge = Load("arc_challenge.yaml");
  EXPECT_EQ(challenge.name, "arc_challenge");
  EXPECT_EQ(challenge.data_files, (std::vector<std::string>{Path("challenge/test.jsonl")}));
  ASSERT_EQ(challenge.items.size(), 1u);
  EXPECT_EQ(challenge.items[0].context,
            "Question: George wants to warm his hands quickly by rubbing them. Which skin "
            "surface will produce the most heat?\nAnswer:");
  EXPECT_EQ(challenge.items[0].choices,
            (std::vector<std::string>{"dry palms", "wet palms", "palms covered with oil",
                                      "palms covered with lotion"}));
  EXPECT_EQ(challenge.items[0].gold, 0);
  EXPECT_NE(challenge.fingerprint, easy.fingerprint);

  // The included file is part of the fingerprint.
  Write("arc_easy.yaml", absl::StrCat(kArcEasy, kMetrics, "# a comment\n"));
  EXPECT_NE(Load("arc_challenge.yaml").fingerprint, challenge.fingerprint);
}

TEST_F(ChoiceTaskTest, SciqFromAJsonArray) {
  Write("sciq.yaml", absl::StrCat(R"(task: sciq
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    train: sciq_train.json
    validation: sciq_valid.json
    test: sciq_test.json
output_type: multiple_choice
training_split: train
validation_split: validation
test_split: test
doc_to_text: "{{support.lstrip()}}\nQuestion: {{question}}\nAnswer:"
doc_to_target: 3
doc_to_choice: "{{[distractor1, distractor2, distractor3, correct_answer]}}"
should_decontaminate: true
doc_to_decontamination_query: "{{support}} {{question}}"
)",
                                  kMetrics));
  Write("sciq_test.json", R"([
  {"question": "What type of organism is commonly used in preparation of foods such as cheese and yogurt?",
   "distractor3": "viruses", "distractor1": "protozoa", "distractor2": "gymnosperms",
   "correct_answer": "mesophilic organisms",
   "support": "  \nMesophiles grow best in moderate temperature."},
  {"question": "What is the least dangerous radioactive decay?", "distractor3": "zeta decay",
   "distractor1": "beta decay", "distractor2": "gamma decay", "correct_answer": "alpha decay",
   "support": ""}
])");
  const ChoiceTask task = Load("sciq.yaml");
  ASSERT_EQ(task.items.size(), 2u);
  EXPECT_EQ(task.items[0].context,
            "Mesophiles grow best in moderate temperature.\nQuestion: What type of organism is "
            "commonly used in preparation of foods such as cheese and yogurt?\nAnswer:");
  EXPECT_EQ(task.items[0].choices, (std::vector<std::string>{"protozoa", "gymnosperms", "viruses",
                                                             "mesophilic organisms"}));
  EXPECT_EQ(task.items[0].gold, 3);
  EXPECT_EQ(task.items[1].context,
            "\nQuestion: What is the least dangerous radioactive decay?\nAnswer:");
  EXPECT_EQ(task.items[1].choices,
            (std::vector<std::string>{"beta decay", "gamma decay", "zeta decay", "alpha decay"}));
  EXPECT_EQ(task.items[1].gold, 3);
}

TEST_F(ChoiceTaskTest, OpenbookqaFieldNameAndLstrippedKey) {
  Write("openbookqa.yaml", absl::StrCat(R"(task: openbookqa
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: openbookqa_test.jsonl
output_type: multiple_choice
training_split: train
validation_split: validation
test_split: test
doc_to_text: question_stem
doc_to_target: "{{choices.label.index(answerKey.lstrip())}}"
doc_to_choice: "{{choices.text}}"
should_decontaminate: true
doc_to_decontamination_query: question_stem
)",
                                        kMetrics));
  Write(
      "openbookqa_test.jsonl",
      R"({"id": "7-980", "question_stem": "The sun is responsible for", "choices": {"text": ["puppies learning new tricks", "children growing up and getting old", "flowers wilting in a vase", "plants sprouting, blooming and wilting"], "label": ["A", "B", "C", "D"]}, "answerKey": " D"}
)");
  const ChoiceTask task = Load("openbookqa.yaml");
  ASSERT_EQ(task.items.size(), 1u);
  EXPECT_EQ(task.items[0].context, "The sun is responsible for");
  EXPECT_EQ(task.items[0].choices[3], "plants sprouting, blooming and wilting");
  EXPECT_EQ(task.items[0].choices.size(), 4u);
  EXPECT_EQ(task.items[0].gold, 3);
}

TEST_F(ChoiceTaskTest, BoolqChoicesAsAYamlList) {
  Write("boolq.yaml", absl::StrCat(R"(tag:
  - super-glue-lm-eval-v1
task: boolq
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    validation: boolq_valid.jsonl
output_type: multiple_choice
training_split: train
validation_split: validation
doc_to_text: "{{passage}}\nQuestion: {{question}}?\nAnswer:"
doc_to_target: label
doc_to_choice: ["no", "yes"]
should_decontaminate: true
doc_to_decontamination_query: passage
)",
                                   kMetrics));
  Write(
      "boolq_valid.jsonl",
      R"({"question": "do iran and afghanistan speak the same language", "passage": "Persian language -- Persian is spoken in Iran and Afghanistan.", "idx": 0, "label": 1}

{"question": "is the sun a planet", "passage": "The Sun is the star at the center of the Solar System.", "idx": 1, "label": 0}
)");
  const ChoiceTask task = Load("boolq.yaml");
  ASSERT_EQ(task.items.size(), 2u);  // the blank line is skipped
  EXPECT_EQ(task.items[0].context,
            "Persian language -- Persian is spoken in Iran and Afghanistan.\nQuestion: do iran "
            "and afghanistan speak the same language?\nAnswer:");
  EXPECT_EQ(task.items[0].choices, (std::vector<std::string>{"no", "yes"}));
  EXPECT_EQ(task.items[0].gold, 1);
  EXPECT_EQ(task.items[1].gold, 0);
}

TEST_F(ChoiceTaskTest, HellaswagLikeWithAStringLabel) {
  Write("hellaswag.yaml", absl::StrCat(R"(tag:
  - multiple_choice
task: hellaswag
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    validation: hellaswag_val.jsonl
output_type: multiple_choice
training_split: train
validation_split: validation
test_split: null
doc_to_text: "{{query}}"
doc_to_target: "{{label}}"
doc_to_choice: "choices"
)",
                                       kMetrics));
  Write(
      "hellaswag_val.jsonl",
      R"({"query": "Removing ice from car: Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles. Then", "choices": [", the man adds wax to the windshield and cuts it.", ", a person board a ski lift, while two men supporting the head of the person wearing winter clothes snow as the we girls sled.", ", the man puts on a christmas coat, knitted with netting.", ", the man continues removing the snow on his car."], "gold": 3, "label": "3"}
)");
  const ChoiceTask task = Load("hellaswag.yaml");
  ASSERT_EQ(task.items.size(), 1u);
  EXPECT_EQ(task.items[0].context,
            "Removing ice from car: Then, the man writes over the snow covering the window of a "
            "car, and a woman wearing winter clothes smiles. Then");
  ASSERT_EQ(task.items[0].choices.size(), 4u);
  EXPECT_EQ(task.items[0].choices[3], ", the man continues removing the snow on his car.");
  EXPECT_EQ(task.items[0].gold, 3);  // "3", digits: an index
}

TEST_F(ChoiceTaskTest, StringTargetIsTheChoiceItEquals) {
  Write("capital.yaml", R"(task: capitals
dataset_path: json
dataset_kwargs:
  data_files: capitals.jsonl
test_split: test
doc_to_text: "The capital of {{country}} is"
doc_to_target: answer
doc_to_choice: "{{options}}"
)");
  Write("capitals.jsonl",
        R"({"country": "France", "options": ["Lyon", "Paris", "Nice"], "answer": "Paris"}
{"country": "Peru", "options": ["Lima", "Cusco"], "answer": "Lima"}
{"country": "Chad", "options": ["Abeche", "N'Djamena"], "answer": "Mongo"}
)");
  // A plain file (no split names) is the split evaluated, whatever test_split says.
  EXPECT_EQ(Load("capital.yaml", 2).items.size(), 2u);
  EXPECT_EQ(Load("capital.yaml", 2).items[0].gold, 1);
  EXPECT_EQ(Load("capital.yaml", 2).items[1].gold, 0);
  const std::string e = Error("capital.yaml");
  EXPECT_HAS(e, absl::StrCat(Path("capitals.jsonl"),
                             ":3: doc_to_target: gives 'Mongo', which "
                             "is not one of the choices ['Abeche', \"N'Djamena\"]"));
}

TEST_F(ChoiceTaskTest, DescriptionTargetDelimiterAndLimitAcrossFiles) {
  Write("task.yaml", R"(task: science
dataset_path: json
dataset_kwargs:
  data_files: [part1.jsonl, part2.jsonl]
validation_split: validation
description: "The following are questions about {{subject}}.\n\n"
target_delimiter: ""
doc_to_text: "{{q}}\nAnswer:"
doc_to_target: "{{gold}}"
doc_to_choice: "{{opts}}"
)");
  Write("part1.jsonl", R"({"subject": "physics", "q": "Q1", "opts": ["a", "b"], "gold": 1}
{"subject": "biology", "q": "Q2", "opts": ["a", "b", "c", "d"], "gold": 0}
)");
  Write("part2.jsonl", R"({"subject": "chemistry", "q": "Q3", "opts": [1, 2.5], "gold": 1}
{"subject": "math", "q": "Q4", "opts": ["x", "y"], "gold": 0}
)");
  const ChoiceTask all = Load("task.yaml");
  EXPECT_EQ(all.target_delimiter, "");
  EXPECT_EQ(all.data_files, (std::vector<std::string>{Path("part1.jsonl"), Path("part2.jsonl")}));
  ASSERT_EQ(all.items.size(), 4u);
  EXPECT_EQ(all.items[0].context, "The following are questions about physics.\n\nQ1\nAnswer:");
  EXPECT_EQ(all.items[2].context, "The following are questions about chemistry.\n\nQ3\nAnswer:");
  EXPECT_EQ(all.items[2].choices, (std::vector<std::string>{"1", "2.5"}));  // numbers as text
  EXPECT_DOUBLE_EQ(all.chance, (0.5 + 0.25 + 0.5 + 0.5) / 4);

  // The first 3 documents: two of the first file, one of the second.
  const ChoiceTask three = Load("task.yaml", 3);
  ASSERT_EQ(three.items.size(), 3u);
  EXPECT_EQ(three.items[2].context, all.items[2].context);
  EXPECT_DOUBLE_EQ(three.chance, (0.5 + 0.25 + 0.5) / 3);
  // Every file is in the fingerprint, read or not.
  EXPECT_EQ(three.fingerprint, all.fingerprint);
  EXPECT_EQ(Load("task.yaml", 1).items.size(), 1u);
  EXPECT_EQ(Load("task.yaml", 100).items.size(), 4u);
}

TEST_F(ChoiceTaskTest, FingerprintFollowsTheFiles) {
  Write("piqa.yaml", PiqaLike());
  const std::string first = Load("piqa.yaml").fingerprint;
  EXPECT_EQ(first.size(), 16u);
  EXPECT_EQ(Load("piqa.yaml").fingerprint, first);  // nothing changed
  Write(
      "piqa_valid.jsonl",
      R"({"goal": "How do I boil an egg?", "sol1": "Put it in boiling water.", "sol2": "Put it in the freezer.", "label": 1}
{"goal": "How do I dry wet shoes?", "sol1": "Put them in the fridge.", "sol2": "Stuff them with newspaper.", "label": 1}
)");
  const std::string changed = Load("piqa.yaml").fingerprint;
  EXPECT_NE(changed, first);
  EXPECT_EQ(Load("piqa.yaml").fingerprint, changed);
  Write("piqa.yaml", PiqaLike({{"description", "\"Answer the question.\\n\""}}));
  EXPECT_NE(Load("piqa.yaml").fingerprint, first);
}

TEST_F(ChoiceTaskTest, TheJinjaSubset) {
  std::string text = R"(task: jinja
dataset_path: json
dataset_kwargs:
  data_files:
    test: docs.jsonl
test_split: test
doc_to_text: |-
  {{ words[-1] }}|{{ words[1:] }}|{{ words[:-2] }}|{{ title[1:3] }}|{{ title[-2:] | upper }}
  {{ ' x '.strip() }}|{{ '--a--'.rstrip('-') }}|{{ title.upper().lower() }}|{{ n }}|{{ f }}|{{ tiny }}|{{ whole }}|{{ flag }}|{{ nothing }}
  {{ tags | join(', ') }}|{{ text.split() | last }}|{{ text.split(' ') }}|{{ 'a-b-c'.replace('-', '+') }}
  {{ nested['k'] }}|{{ nested.k }}|{{ words + ['z'] }}|{{ title + '!' }}|{{ quotes }}|{{ nested }}
  {{ '/'.join(words) }}|{{ tags | first }}|{{ title.index('l') }}|{{ -n + 10 }}|{{- '  trimmed  ' -}}  |{{ '\t' | trim }}|{{ "it's" }}
doc_to_target: "{{ words.index('b') - 0 if false else 0 }}"
doc_to_choice: ["{{ words[0] }}", "{{ n }}"]
)";
  Write("task.yaml", text);
  Write(
      "docs.jsonl",
      R"({"words": ["a", "b", "c"], "title": "hello", "n": 7, "f": 0.5, "tiny": 0.00001, "whole": 2.0, "flag": true, "nothing": null, "tags": ["x", "y"], "text": "one two  three", "nested": {"k": "v", "n": [1]}, "quotes": ["it's", "say \"hi\"", "back\\slash"]}
)");
  // The target uses operators outside the subset: refused by name when the file is read.
  std::string e = Error("task.yaml");
  EXPECT_HAS(e, absl::StrCat(Path("task.yaml"), ":", LineOf(text, "doc_to_target"),
                             ": doc_to_target: {{ words.index('b') - 0 if false else 0 }}: "
                             "operator '-' is not supported"));

  const std::string bad = "doc_to_target: \"{{ words.index('b') - 0 if false else 0 }}\"";
  text.replace(text.find(bad), bad.size(), "doc_to_target: \"{{ words.index('b') }}\"");
  Write("task.yaml", text);
  const ChoiceTask task = Load("task.yaml");
  ASSERT_EQ(task.items.size(), 1u);
  EXPECT_EQ(task.items[0].context,
            "c|['b', 'c']|['a']|el|LO\n"
            "x|--a|hello|7|0.5|1e-05|2.0|True|None\n"
            "x, y|three|['one', 'two', '', 'three']|a+b+c\n"
            "v|v|['a', 'b', 'c', 'z']|hello!|[\"it's\", 'say \"hi\"', 'back\\\\slash']|{'k': 'v', "
            "'n': [1]}\n"
            "a/b/c|x|2|3|  trimmed  ||it's");
  EXPECT_EQ(task.items[0].choices, (std::vector<std::string>{"a", "7"}));
  EXPECT_EQ(task.items[0].gold, 1);  // words.index('b')
}

// ---- Refused task files and bad documents: FILE:LINE: field: what ----------------------------

TEST_F(ChoiceTaskTest, FunctionTagsAreRefused) {
  // winogrande.yaml of the harness.
  const std::string text = R"(task: winogrande
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    validation: winogrande_dev.jsonl
output_type: multiple_choice
training_split: train
validation_split: validation
doc_to_text: !function preprocess_winogrande.doc_to_text
doc_to_target: !function preprocess_winogrande.doc_to_target
doc_to_choice: !function preprocess_winogrande.doc_to_choice
should_decontaminate: true
doc_to_decontamination_query: sentence
)";
  Write("winogrande.yaml", text);
  const std::string e = Error("winogrande.yaml");
  EXPECT_HAS(e, absl::StrCat(Path("winogrande.yaml"), ":", LineOf(text, "doc_to_text:"),
                             ": doc_to_text: !function preprocess_winogrande.doc_to_text: Python "
                             "functions are not supported"));

  // Anywhere, nested too.
  const std::string nested = PiqaLike({}, "metric_list:\n  - metric: !function m.acc\n");
  Write("nested.yaml", nested);
  EXPECT_HAS(Error("nested.yaml"),
             absl::StrCat(Path("nested.yaml"), ":", LineOf(nested, "!function"),
                          ": metric_list[0].metric: !function m.acc: Python functions are not "
                          "supported"));
}

TEST_F(ChoiceTaskTest, RefusedKeysAndSettings) {
  struct Case {
    std::vector<std::pair<std::string, std::string>> overrides;
    std::string extra;
    std::string line_of;   // the text whose line the error names
    std::string expected;  // after "FILE:LINE: "
  };
  const std::vector<Case> cases = {
      {{{"process_docs", "!function utils.process_docs"}},
       "",
       "process_docs",
       "process_docs: not supported: it runs Python over the documents"},
      {{{"process_results", "!function utils.process_results"}},
       "",
       "process_results",
       "process_results: not supported"},
      {{{"doc_to_text", R"("{% if goal %}{{goal}}{% endif %}")"}},
       "",
       "doc_to_text",
       "doc_to_text: {% statements %} are not supported"},
      {{{"doc_to_text", R"("{# note #}{{goal}}")"}},
       "",
       "doc_to_text",
       "doc_to_text: {# comments #} are not supported"},
      {{{"doc_to_text", R"("{{goal | regex_replace('a', 'b')}}")"}},
       "",
       "doc_to_text",
       "doc_to_text: {{goal | regex_replace('a', 'b')}}: filter 'regex_replace' is not supported "
       "(the filters: trim, lower, upper, join, first, last)"},
      {{{"doc_to_target", R"("{{choices.label.find(answerKey)}}")"}},
       "",
       "doc_to_target",
       "doc_to_target: {{choices.label.find(answerKey)}}: method 'find' is not supported"},
      {{{"doc_to_target", R"("{{len(choices)}}")"}},
       "",
       "doc_to_target",
       "doc_to_target: {{len(choices)}}: function 'len' is not supported"},
      {{{"doc_to_target", R"("{{label")"}},
       "",
       "doc_to_target",
       "doc_to_target: {{label: a {{ without its closing }}"},
      {{{"output_type", "generate_until"}},
       "",
       "output_type",
       "output_type: generate_until is not supported: only multiple_choice"},
      {{{"dataset_path", "piqa"}}, "", "dataset_path", "dataset_path: piqa is not supported"},
      {{{"dataset_name", "ARC-Challenge"}}, "", "dataset_name", "dataset_name: must be null"},
      {{{"num_fewshot", "5"}}, "", "num_fewshot", "num_fewshot: 5: only 0 is supported"},
      {{},
       "metric_list:\n  - metric: acc\n    aggregation: mean\n  - metric: f1\n",
       "metric: f1",
       "metric_list[1].metric: f1 is not supported"},
      {{{"generation_kwargs", "{until: [\"\\n\"]}"}},
       "",
       "generation_kwargs",
       "generation_kwargs: not supported"},
      {{{"filter_list", "[]"}}, "", "filter_list", "filter_list: not supported"},
      {{{"doc_to_txt", "goal"}},
       "",
       "doc_to_txt",
       "doc_to_txt: unknown or unsupported key (did you mean doc_to_text?)"},
      {{{"task", "two words"}}, "", "task:", "task: 'two words' is not a usable name"},
      {{{"task", ""}}, "", "", "task: missing"},
      {{{"doc_to_choice", "[\"only\"]"}},
       "",
       "doc_to_choice",
       "doc_to_choice: lists 1 choice(s) — multiple_choice needs at least 2"},
      {{{"validation_split", ""}}, "", "", "test_split: missing"},
      {{{"dataset_kwargs", "{data_files: {train: piqa_train.jsonl, test: t.jsonl}}"}},
       "",
       "dataset_kwargs",
       "dataset_kwargs.data_files: no split 'validation' (the validation_split evaluated), and "
       "the splits given are: train, test"},
      {{{"dataset_kwargs", "{data_files: x.jsonl, trust_remote_code: true}"}},
       "",
       "dataset_kwargs",
       "dataset_kwargs.trust_remote_code: not supported"},
      {{{"target_delimiter", "[a]"}},
       "",
       "target_delimiter",
       "target_delimiter: expected a string"},
      {{}, "doc_to_text: goal\n", "doc_to_text: goal", "doc_to_text: given twice"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string name = absl::StrCat("case", i, ".yaml");
    const std::string text = PiqaLike(c.overrides, c.extra);
    Write(name, text);
    const int line = c.line_of.empty() ? 1 : LineOf(text, c.line_of);
    ASSERT_GT(line, 0) << i;
    EXPECT_HAS(Error(name), absl::StrCat(Path(name), ":", line, ": ", c.expected)) << "case " << i;
    // One problem, one line: a spec's problems are joined with "; " (ValidateRunConfig) and
    // split on it again where they are reported.
    EXPECT_EQ(Error(name).find("; "), std::string::npos) << "case " << i << ": " << Error(name);
  }
  // The base task is valid: each case fails for its own reason.
  Write("base.yaml", PiqaLike());
  EXPECT_EQ(Load("base.yaml").items.size(), 2u);
}

TEST_F(ChoiceTaskTest, IncludeCycleDepthAndMissingBase) {
  Write("a.yaml", "include: b.yaml\ntask: a\n");
  Write("b.yaml", "task: b\ninclude: a.yaml\n");
  EXPECT_HAS(Error("a.yaml"), absl::StrCat(Path("b.yaml"), ":2: include: "));
  EXPECT_HAS(Error("a.yaml"), "an include cycle");

  Write("self.yaml", "include: ./self.yaml\n");
  EXPECT_HAS(Error("self.yaml"), "an include cycle");

  // A chain of 8 includes is read; 9 are refused.
  Write("piqa.yaml", PiqaLike());
  for (int i = 1; i <= 9; ++i) {
    Write(absl::StrCat("level", i, ".yaml"),
          absl::StrCat("include: ", i == 1 ? "piqa.yaml" : absl::StrCat("level", i - 1, ".yaml"),
                       "\n"));
  }
  EXPECT_EQ(Load("level8.yaml").name, "piqa");
  EXPECT_HAS(Error("level9.yaml"), "more than 8 levels of include");

  Write("orphan.yaml", "include: sub/missing.yaml\ntask: x\n");
  const absl::StatusOr<ChoiceTask> missing = LoadChoiceTask(Path("orphan.yaml"), 0);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_HAS(std::string(missing.status().message()),
             absl::StrCat(Path("orphan.yaml"), ":1: include: ", Path("sub/missing.yaml")));
  EXPECT_EQ(LoadChoiceTask(Path("nowhere.yaml"), 0).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ChoiceTaskTest, BadDocumentsNameTheirFileAndLine) {
  const std::string data = Path("piqa_valid.jsonl");
  Write("piqa.yaml", PiqaLike());
  // Gold out of range, on the second line.
  Write("piqa_valid.jsonl", R"({"goal": "g", "sol1": "a", "sol2": "b", "label": 0}
{"goal": "g", "sol1": "a", "sol2": "b", "label": 2}
)");
  EXPECT_HAS(Error("piqa.yaml"),
             absl::StrCat(data, ":2: doc_to_target: gives 2, out of range for 2 choices (0 to 1)"));
  // Only the first document read: no error.
  EXPECT_EQ(Load("piqa.yaml", 1).items.size(), 1u);

  // Malformed JSON on line 3 (line 2 blank).
  Write("piqa_valid.jsonl", R"({"goal": "g", "sol1": "a", "sol2": "b", "label": 0}

{"goal": "g", "sol1": "a" "sol2": "b", "label": 0}
)");
  EXPECT_HAS(Error("piqa.yaml"), absl::StrCat(data, ":3: not valid JSON: parse error at column"));
  Write("piqa_valid.jsonl", "[1, 2]\n");
  EXPECT_HAS(Error("piqa.yaml"), absl::StrCat(data, ": document [0]: a document is a JSON object"));
  Write("piqa_valid.jsonl", "[{\"goal\": 1,\n \"sol1\": }]\n");
  EXPECT_HAS(Error("piqa.yaml"), absl::StrCat(data, ":2: not valid JSON"));

  // An undefined field: the document's fields listed, the template's place named.
  Write("piqa_valid.jsonl", R"({"gaol": "g", "sol1": "a", "sol2": "b", "label": 0}
)");
  const std::string text = PiqaLike();
  Write("piqa.yaml", text);
  Write("piqa_valid.jsonl", R"({"gaol": "g", "sol1": "a", "sol2": "b", "label": 0}
)");
  EXPECT_HAS(Error("piqa.yaml"),
             absl::StrCat(data,
                          ":1: doc_to_text: {{goal}}: 'goal' is undefined (the document's "
                          "fields: gaol, sol1, sol2, label) (",
                          Path("piqa.yaml"), ":", LineOf(text, "doc_to_text"), ")"));

  // A choice that is not text, and a list of choices that is not a list.
  Write("piqa_valid.jsonl", R"({"goal": "g", "sol1": "a", "sol2": null, "label": 0}
)");
  EXPECT_HAS(
      Error("piqa.yaml"),
      absl::StrCat(data, ":1: doc_to_choice: choice [1] is a NoneType (None), not a string"));
  Write("p2.yaml", PiqaLike({{"doc_to_choice", "sol1"}}));
  Write("piqa_valid.jsonl", R"({"goal": "g", "sol1": "a", "sol2": "b", "label": 0}
)");
  EXPECT_HAS(Error("p2.yaml"),
             absl::StrCat(data, ":1: doc_to_choice: gives a str ('a'), not a list"));

  // Items of an array are named by index; the wrong type in an expression.
  Write("p3.yaml", PiqaLike({{"dataset_kwargs", "{data_files: {validation: arr.json}}"},
                             {"doc_to_text", R"("{{goal.strip()}}")"}}));
  Write("arr.json", R"([{"goal": "g", "sol1": "a", "sol2": "b", "label": 0},
                       {"goal": 5, "sol1": "a", "sol2": "b", "label": 0}])");
  EXPECT_HAS(Error("p3.yaml"), absl::StrCat(Path("arr.json"),
                                            ": document [1]: doc_to_text: {{goal.strip()}}: an "
                                            "int has no method strip() (",
                                            Path("p3.yaml"), ":8)"));

  // A data file that is not there: NotFound, naming it and the key naming it.
  Write("p4.yaml", PiqaLike({{"dataset_kwargs", "{data_files: {validation: gone.jsonl}}"}}));
  const absl::StatusOr<ChoiceTask> gone = LoadChoiceTask(Path("p4.yaml"), 0);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_HAS(std::string(gone.status().message()), Path("gone.jsonl"));
  EXPECT_HAS(std::string(gone.status().message()),
             absl::StrCat(Path("p4.yaml"), ":4: dataset_kwargs.data_files: "));

  // No documents at all.
  Write("piqa_valid.jsonl", "\n\n");
  EXPECT_HAS(Error("piqa.yaml"), "no documents in the split 'validation'");
}

TEST(ChoiceMetricNamesTest, NameAccNormAndLogprob) {
  EXPECT_EQ(ChoiceMetricNames("piqa"),
            (std::vector<std::string>{"piqa", "piqa@acc_norm", "piqa@logprob"}));
}

TEST_F(ChoiceTaskTest, ApplyChoiceTasksFillsNameFingerprintAndChance) {
  Write("piqa.yaml", PiqaLike());
  Write("boolq.yaml", PiqaLike({{"task", "yesno"},
                                {"doc_to_choice", "[\"no\", \"maybe\", \"yes\", \"never\"]"}}));
  RunConfig config = DefaultRunConfig();
  EvalTask* mqar = config.mutable_train()->add_evals();
  mqar->set_task("mqar");
  EvalTask* piqa = config.mutable_train()->add_evals();
  piqa->set_task(kMultipleChoiceTask);
  piqa->set_file(Path("piqa.yaml"));
  piqa->set_samples(1);
  EvalTask* yesno = config.mutable_train()->add_evals();
  yesno->set_task(kMultipleChoiceTask);
  yesno->set_file(Path("boolq.yaml"));
  const EvalTask mqar_before = *mqar;
  ASSERT_TRUE(ApplyChoiceTasks(&config).ok());
  EXPECT_EQ(config.train().evals(0).SerializeAsString(), mqar_before.SerializeAsString());
  EXPECT_EQ(config.train().evals(1).name(), "piqa");
  EXPECT_EQ(config.train().evals(1).fingerprint(), Load("piqa.yaml", 1).fingerprint);
  EXPECT_DOUBLE_EQ(config.train().evals(1).chance(), 0.5);
  EXPECT_EQ(config.train().evals(2).name(), "yesno");
  EXPECT_EQ(config.train().evals(2).fingerprint().size(), 16u);
  EXPECT_NE(config.train().evals(2).fingerprint(), config.train().evals(1).fingerprint());
  EXPECT_DOUBLE_EQ(config.train().evals(2).chance(), 0.25);

  RunConfig no_file = DefaultRunConfig();
  no_file.mutable_train()->add_evals()->set_task(kMultipleChoiceTask);
  absl::Status s = ApplyChoiceTasks(&no_file);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "train.evals[0].file: multiple_choice needs a task file");

  RunConfig bad = DefaultRunConfig();
  bad.mutable_train()->add_evals()->set_task("mqar");
  bad.mutable_train()->add_evals()->set_task(kMultipleChoiceTask);
  bad.mutable_train()->mutable_evals(1)->set_file(Path("missing.yaml"));
  s = ApplyChoiceTasks(&bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_HAS(std::string(s.message()), absl::StrCat("train.evals[1].file: ", Path("missing.yaml")));

  Write("gen.yaml", PiqaLike({{"output_type", "generate_until"}}));
  bad.mutable_train()->mutable_evals(1)->set_file(Path("gen.yaml"));
  s = ApplyChoiceTasks(&bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(std::string(s.message()),
             absl::StrCat("train.evals[1].file: ", Path("gen.yaml"), ":5: output_type: "));
}

}  // namespace
}  // namespace ablate
