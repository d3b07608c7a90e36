// tests/dist/inside_tour_test.cpp — docs/inside.md, the guided tour, cannot go stale: every
// `sh` block of it runs (in order, in a scratch directory, with build/ meaning this build) and
// must exit 0 and print each line its `# expect:` comments name; every Note it links must exist
// in the source.

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "scratch_dir.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Block {
  std::string script;
  std::vector<std::string> expected;
  int line = 0;  // where it starts in the page
};

std::vector<Block> sh_blocks(const std::string& page) {
  std::vector<Block> blocks;
  std::istringstream in(page);
  std::string line;
  bool inside = false;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!inside && line == "```sh") {
      inside = true;
      blocks.push_back({"", {}, number});
    } else if (inside && line == "```") {
      inside = false;
    } else if (inside) {
      const std::string mark = "# expect: ";
      if (line.rfind(mark, 0) == 0)
        blocks.back().expected.push_back(line.substr(mark.size()));
      else
        blocks.back().script += line + "\n";
    }
  }
  return blocks;
}

// Every occurrence of `from` in `text` replaced by `to`.
std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

TEST(InsideTour, EveryCommandRunsAndPrintsWhatThePageSays) {
  const fs::path binary(LOOM_BINARY_DIR);
  if (!fs::exists(binary / "apps" / "resnet18_cifar") || !fs::exists(binary / "apps" / "loomrun"))
    GTEST_SKIP() << "the apps are not built";
  const std::vector<Block> blocks =
      sh_blocks(read(fs::path(LOOM_SOURCE_DIR) / "docs" / "inside.md"));
  ASSERT_GE(blocks.size(), 10u) << "docs/inside.md has lost its steps";
  const loom::test::ScratchDir dir;
  for (const Block& block : blocks) {
    SCOPED_TRACE("docs/inside.md, the block at line " + std::to_string(block.line));
    EXPECT_FALSE(block.expected.empty()) << "a step that says nothing to look for";
    const std::string script =
        replace_all(block.script, "build/apps/", (binary / "apps").string() + "/");
    const std::string file = dir.file("step.sh"), log = dir.file("step.log");
    std::ofstream(file) << "set -e\ncd '" << dir.path().string() << "'\n" << script;
    const int status = std::system(("bash " + file + " > " + log + " 2>&1").c_str());
    const std::string output = read(log);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << block.script << output;
    for (const std::string& expected : block.expected)
      EXPECT_NE(output.find(expected), std::string::npos)
          << "expected \"" << expected << "\" from\n"
          << block.script << output;
  }
}

TEST(InsideTour, EveryNoteItLinksIsInTheSource) {
  std::string page = read(fs::path(LOOM_SOURCE_DIR) / "docs" / "inside.md");
  for (char& c : page)
    if (c == '\n') c = ' ';  // a Note's name may break across lines
  page = std::regex_replace(page, std::regex(" +"), " ");
  std::set<std::string> notes;
  const std::regex note(R"(Note \[([^\]]+)\])");
  for (auto it = std::sregex_iterator(page.begin(), page.end(), note); it != std::sregex_iterator();
       ++it)
    notes.insert((*it)[1]);
  ASSERT_GE(notes.size(), 10u);
  // Each Note is defined by a comment line that names it alone: "// Note [Name]".
  std::string sources;
  for (const char* folder : {"dist", "apps", "tensor", "autograd", "nn", "optim"})
    for (const auto& entry : fs::recursive_directory_iterator(fs::path(LOOM_SOURCE_DIR) / folder)) {
      const std::string ext = entry.path().extension().string();
      if (ext == ".h" || ext == ".cpp" || ext == ".cu") sources += read(entry.path());
    }
  for (const std::string& name : notes)
    EXPECT_NE(sources.find("// Note [" + name + "]\n"), std::string::npos)
        << "docs/inside.md links Note [" << name << "], which no source file defines";
}

}  // namespace
