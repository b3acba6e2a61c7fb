// The SQL of `ablate tag`, `untag` and `note` (store_internal.h): an annotation of a sweep or of
// one of its runs, and its event. Runs on the writer's connection inside the flush transaction
// (writer.cc).
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "orchestrator/store/store_internal.h"

namespace ablate {
namespace store_internal {

absl::Status ApplyAnnotate(StoreWriter& w, const AnnotationEdit& edit, AnnotationResult* result) {
  // The target first: a sweep, or one of its runs.
  STORE_ASSIGN_OR_RETURN(sweep, w.Get("SELECT name FROM sweeps WHERE id = ?1"));
  sweep->Bind(1, edit.sweep_id);
  STORE_ASSIGN_OR_RETURN(sweep_found, sweep->Step());
  const std::string sweep_name = sweep_found ? sweep->ColumnText(0) : "";
  sweep->Reset();
  if (!sweep_found) return absl::NotFoundError(absl::StrCat("store: no sweep ", edit.sweep_id));
  std::string target = absl::StrCat("sweep ", sweep_name);
  if (edit.run_id != 0) {
    STORE_ASSIGN_OR_RETURN(run, w.Get("SELECT 1 FROM runs WHERE id = ?1 AND sweep_id = ?2"));
    run->Bind(1, edit.run_id).Bind(2, edit.sweep_id);
    STORE_ASSIGN_OR_RETURN(run_found, run->Step());
    run->Reset();
    if (!run_found) {
      return absl::NotFoundError(
          absl::StrCat("store: sweep ", sweep_name, " has no run ", edit.run_id));
    }
    target = absl::StrCat("run ", edit.run_id, " of sweep ", sweep_name);
  }
  // Binds the target (?1 the sweep, ?2 the run or NULL) and `text` (?3) of the annotation.
  auto bind_annotation = [&](Stmt* stmt, const std::string& text) -> Stmt& {
    stmt->Bind(1, edit.sweep_id);
    if (edit.run_id != 0) {
      stmt->Bind(2, edit.run_id);
    } else {
      stmt->BindNull(2);
    }
    return stmt->Bind(3, text);
  };
  switch (edit.action) {
    case AnnotationEdit::Action::kNote: {
      STORE_ASSIGN_OR_RETURN(insert, w.Get("INSERT INTO annotations (sweep_id, run_id, kind, text, "
                                           "created_at) VALUES (?1, ?2, 'note', ?3, ?4)"));
      bind_annotation(insert, edit.texts.front()).Bind(4, w.Now());
      STORE_RETURN_IF_ERROR(insert->Run());
      result->note_id = sqlite3_last_insert_rowid(w.db());
      result->changed.push_back(edit.texts.front());
      return InsertEvent(w, edit.sweep_id, edit.run_id, "annotation",
                         absl::StrCat("note on ", target, ": ", edit.texts.front()));
    }
    case AnnotationEdit::Action::kTag: {
      // OR IGNORE: a tag the target carries already stays as it was (annotations_tag_once).
      STORE_ASSIGN_OR_RETURN(insert, w.Get("INSERT OR IGNORE INTO annotations (sweep_id, run_id, "
                                           "kind, text, created_at) VALUES (?1, ?2, 'tag', ?3, "
                                           "?4)"));
      for (const std::string& tag : edit.texts) {
        bind_annotation(insert, tag).Bind(4, w.Now());
        STORE_RETURN_IF_ERROR(insert->Run());
        (sqlite3_changes(w.db()) > 0 ? result->changed : result->unchanged).push_back(tag);
      }
      if (result->changed.empty()) return absl::OkStatus();
      return InsertEvent(
          w, edit.sweep_id, edit.run_id, "annotation",
          absl::StrCat("tagged ", target, ": ", absl::StrJoin(result->changed, " ")));
    }
    case AnnotationEdit::Action::kUntag: {
      // Every tag must be there before any is removed: an untag that names a missing tag
      // removes nothing.
      STORE_ASSIGN_OR_RETURN(has, w.Get("SELECT 1 FROM annotations WHERE sweep_id = ?1 AND "
                                        "coalesce(run_id, 0) = coalesce(?2, 0) AND kind = 'tag' "
                                        "AND text = ?3"));
      for (const std::string& tag : edit.texts) {
        bind_annotation(has, tag);
        STORE_ASSIGN_OR_RETURN(found, has->Step());
        has->Reset();
        if (!found) {
          return absl::NotFoundError(absl::StrCat("store: ", target, " has no tag \"", tag, "\""));
        }
      }
      STORE_ASSIGN_OR_RETURN(remove, w.Get("DELETE FROM annotations WHERE sweep_id = ?1 AND "
                                           "coalesce(run_id, 0) = coalesce(?2, 0) AND "
                                           "kind = 'tag' AND text = ?3"));
      for (const std::string& tag : edit.texts) {
        bind_annotation(remove, tag);
        STORE_RETURN_IF_ERROR(remove->Run());
        // A tag named twice is removed once.
        if (sqlite3_changes(w.db()) > 0) result->changed.push_back(tag);
      }
      return InsertEvent(
          w, edit.sweep_id, edit.run_id, "annotation",
          absl::StrCat("untagged ", target, ": ", absl::StrJoin(result->changed, " ")));
    }
  }
  return absl::InvalidArgumentError("store: annotate: unknown action");
}

}  // namespace store_internal
}  // namespace ablate
