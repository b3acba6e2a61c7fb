// Tags and notes on sweeps and runs (schema version 9): Store::Annotate, the reader's Annotations
// and RunsTagged, and run_summary's tags column, over a real SQLite file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "orchestrator/store/reader.h"
#include "orchestrator/store/schema.h"
#include "orchestrator/store/store.h"
#include "tests/orchestrator/store/store_fixture.h"
#include "tests/orchestrator/store/test_sweeps.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Action = AnnotationEdit::Action;

class AnnotationsTest : public testing::StoreFixture {
 protected:
  void SetUp() override {
    OpenStore("annotations_test", testing::MakeSweep("gates", {"baseline", "g1"}, 2, 100), &ids_);
    if (HasFatalFailure()) return;
    ASSERT_NO_FATAL_FAILURE(
        CreateSweep(testing::MakeSweep("other", {"baseline"}, 1, 100), &other_));
  }

  absl::StatusOr<AnnotationResult> Edit(Action action, int64_t run_id,
                                        std::vector<std::string> texts) {
    return store_->Annotate({ids_.sweep_id, run_id, action, std::move(texts)});
  }

  // run_summary's tags of each run of the sweep, in run order.
  std::vector<std::string> SummaryTags() {
    absl::StatusOr<QueryResult> result = store_->reader().ReadOnlyQuery(
        "SELECT tags FROM run_summary WHERE sweep = 'gates' ORDER BY run_index");
    EXPECT_TRUE(result.ok()) << result.status();
    std::vector<std::string> tags;
    if (!result.ok()) return tags;
    for (const auto& row : result->rows) tags.push_back(std::get<std::string>(row[0]));
    return tags;
  }

  SweepIds ids_, other_;
};

TEST_F(AnnotationsTest, ASweepsAndARunsTagsAndNotesAreReadBackOldestFirst) {
  EXPECT_GE(StoreSchemaVersion(), 9);  // annotations came with version 9
  const int64_t run = ids_.run_ids[1];
  absl::StatusOr<AnnotationResult> tagged = Edit(Action::kTag, 0, {"phase1", "lr:3e-4"});
  ASSERT_TRUE(tagged.ok()) << tagged.status();
  EXPECT_THAT(tagged->changed, ElementsAre("phase1", "lr:3e-4"));
  EXPECT_TRUE(tagged->unchanged.empty());
  ASSERT_TRUE(Edit(Action::kTag, run, {"bugged"}).ok());
  absl::StatusOr<AnnotationResult> note = Edit(Action::kNote, run, {"data loader bug, see #12"});
  ASSERT_TRUE(note.ok()) << note.status();
  EXPECT_GT(note->note_id, 0);

  absl::StatusOr<std::vector<Annotation>> all = store_->reader().Annotations(ids_.sweep_id);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 4u);
  EXPECT_EQ((*all)[0].text, "phase1");
  EXPECT_EQ((*all)[0].run_id, 0);
  EXPECT_EQ((*all)[0].kind, "tag");
  EXPECT_EQ((*all)[1].text, "lr:3e-4");
  EXPECT_EQ((*all)[2].text, "bugged");
  EXPECT_EQ((*all)[2].run_id, run);
  EXPECT_EQ((*all)[3].kind, "note");
  EXPECT_EQ((*all)[3].id, note->note_id);
  EXPECT_EQ((*all)[3].sweep_id, ids_.sweep_id);
  EXPECT_GT((*all)[3].created_at, 0);
  // Another sweep's list stays empty.
  absl::StatusOr<std::vector<Annotation>> none = store_->reader().Annotations(other_.sweep_id);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());

  // Each run shows its own tags and the sweep's, sorted.
  EXPECT_THAT(SummaryTags(), ElementsAre("lr:3e-4,phase1", "bugged,lr:3e-4,phase1",
                                         "lr:3e-4,phase1", "lr:3e-4,phase1"));
  absl::StatusOr<QueryResult> event = store_->reader().ReadOnlyQuery(
      "SELECT message FROM events WHERE kind = 'annotation' ORDER BY id");
  ASSERT_TRUE(event.ok()) << event.status();
  ASSERT_EQ(event->rows.size(), 3u);
  EXPECT_EQ(std::get<std::string>(event->rows[0][0]), "tagged sweep gates: phase1 lr:3e-4");
  EXPECT_EQ(std::get<std::string>(event->rows[2][0]),
            "note on run 2 of sweep gates: data loader bug, see #12");
}

TEST_F(AnnotationsTest, ATagIsStoredOncePerTargetAndUntaggedOnlyWhereItIs) {
  const int64_t run = ids_.run_ids[0];
  ASSERT_TRUE(Edit(Action::kTag, 0, {"bugged"}).ok());
  // The same tag on a run of the sweep is another target.
  absl::StatusOr<AnnotationResult> on_run = Edit(Action::kTag, run, {"bugged"});
  ASSERT_TRUE(on_run.ok()) << on_run.status();
  EXPECT_THAT(on_run->changed, ElementsAre("bugged"));
  absl::StatusOr<AnnotationResult> again = Edit(Action::kTag, 0, {"bugged", "keep"});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(again->changed, ElementsAre("keep"));
  EXPECT_THAT(again->unchanged, ElementsAre("bugged"));
  absl::StatusOr<std::vector<Annotation>> all = store_->reader().Annotations(ids_.sweep_id);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 3u);

  // An untag naming a tag the target lacks removes nothing, the others included.
  absl::StatusOr<AnnotationResult> missing = Edit(Action::kUntag, 0, {"keep", "nope"});
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("sweep gates has no tag \"nope\""));
  absl::StatusOr<AnnotationResult> removed = Edit(Action::kUntag, 0, {"keep", "bugged"});
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(removed->changed, ElementsAre("keep", "bugged"));
  // The run's own tag is still there.
  EXPECT_THAT(SummaryTags(), ElementsAre("bugged", "", "", ""));
  absl::StatusOr<AnnotationResult> gone = Edit(Action::kUntag, 0, {"bugged"});
  EXPECT_TRUE(absl::IsNotFound(gone.status())) << gone.status();
}

TEST_F(AnnotationsTest, RunsTaggedFindsRunsByTheirOwnTagsOrTheirSweeps) {
  ASSERT_TRUE(Edit(Action::kTag, ids_.run_ids[1], {"bugged"}).ok());
  ASSERT_TRUE(Edit(Action::kTag, ids_.run_ids[3], {"slow"}).ok());
  ASSERT_TRUE(Edit(Action::kNote, ids_.run_ids[2], {"bugged"}).ok());  // a note is no tag
  const StoreReader& reader = store_->reader();
  absl::StatusOr<std::set<int64_t>> bugged = reader.RunsTagged(ids_.sweep_id, {"bugged"});
  ASSERT_TRUE(bugged.ok()) << bugged.status();
  EXPECT_EQ(*bugged, (std::set<int64_t>{ids_.run_ids[1]}));
  absl::StatusOr<std::set<int64_t>> either =
      reader.RunsTagged(ids_.sweep_id, {"slow", "bugged", "absent"});
  ASSERT_TRUE(either.ok()) << either.status();
  EXPECT_EQ(*either, (std::set<int64_t>{ids_.run_ids[1], ids_.run_ids[3]}));
  absl::StatusOr<std::set<int64_t>> nothing = reader.RunsTagged(ids_.sweep_id, {});
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_TRUE(nothing->empty());

  // A tag on the sweep marks every run of it, and no run of another sweep.
  ASSERT_TRUE(Edit(Action::kTag, 0, {"phase1"}).ok());
  absl::StatusOr<std::set<int64_t>> whole = reader.RunsTagged(ids_.sweep_id, {"phase1"});
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(*whole, std::set<int64_t>(ids_.run_ids.begin(), ids_.run_ids.end()));
  absl::StatusOr<std::set<int64_t>> other = reader.RunsTagged(other_.sweep_id, {"phase1"});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(other->empty());
}

TEST_F(AnnotationsTest, AnUnknownSweepOrARunOfAnotherSweepIsRefused) {
  absl::StatusOr<AnnotationResult> no_sweep = store_->Annotate({999, 0, Action::kTag, {"x"}});
  EXPECT_TRUE(absl::IsNotFound(no_sweep.status())) << no_sweep.status();
  EXPECT_THAT(no_sweep.status().message(), HasSubstr("no sweep 999"));
  absl::StatusOr<AnnotationResult> foreign = Edit(Action::kTag, other_.run_ids[0], {"x"});
  EXPECT_TRUE(absl::IsNotFound(foreign.status())) << foreign.status();
  EXPECT_THAT(foreign.status().message(),
              HasSubstr(absl::StrCat("sweep gates has no run ", other_.run_ids[0])));
  absl::StatusOr<AnnotationResult> empty = Edit(Action::kTag, 0, {});
  EXPECT_TRUE(absl::IsInvalidArgument(empty.status())) << empty.status();
  absl::StatusOr<AnnotationResult> two_notes = Edit(Action::kNote, 0, {"a", "b"});
  EXPECT_TRUE(absl::IsInvalidArgument(two_notes.status())) << two_notes.status();
  absl::StatusOr<std::vector<Annotation>> all = store_->reader().Annotations(ids_.sweep_id);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->empty());
}

}  // namespace
}  // namespace ablate
